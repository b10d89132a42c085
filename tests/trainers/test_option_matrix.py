"""The option matrix: every PAIR of interacting option values, GRPO and PPO, on the tiny CPU Llama.

Each factor below is one axis of options that interact (estimator, branching policy, multi-turn env with
env nodes, asynchronous rollouts, packed update and prefix sharing, replay + task pool, EPO, curriculum,
shaping, loss variant, epochs x minibatches, resume mid-run, engine hf vs ours, LoRA / gradient
checkpointing; for PPO the critic, GAE and value options). A small deterministic greedy generator
(`pairwise`) picks cases until every pair of values of two factors appears in at least one case; the pairs
the config refuses (`GRPO_REFUSED`, `PPO_REFUSED`) are left out of the runs and each gets a case of its own
that must fail at config construction with a ConfigError naming both options.

Every run case trains two steps and must end with finite losses, finite advantages at every policy-loss
call, both steps logged under documented names, and engine=fast really rolling out on our engine; a resume
case also runs killed right after its step-1 checkpoint and resumed from another initialisation, whose
step 2 must equal the uninterrupted one (metrics and weights; `exact` says where timing forbids it). The matrix is marked ``option_matrix``: by default a fixed sample runs (every
``SAMPLE_EVERY``-th case: about 1 CPU minute; all of it about 2); ``TOOLGYM_FULL_MATRIX=1`` runs all of it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections.abc import Callable, Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.testing_env import COUNTER
from tests.trainers.conftest import FAKE_ENV, register_fake_env, tiny_model
from tests.trainers.killing import dies_after_save
from tests.trainers.test_train import records
from toolgym.errors import ConfigError

Factors = dict[str, dict[str, dict[str, Any]]]  # factor -> value -> config keys
Pair = frozenset[tuple[str, str]]

# ----- the generator ------------------------------------------------------------------------------------------


def pair(a: tuple[str, str], b: tuple[str, str]) -> Pair:
    return frozenset((a, b))


def all_pairs(factors: Factors, refused: set[Pair]) -> set[Pair]:
    """Every pair of values of two different factors that the config accepts."""
    out = set()
    for f, g in combinations(factors, 2):
        for v in factors[f]:
            for w in factors[g]:
                p = pair((f, v), (g, w))
                if p not in refused:
                    out.add(p)
    return out


def pairwise(factors: Factors, refused: set[Pair]) -> list[dict[str, str]]:
    """Cases (factor -> value) covering every accepted pair at least once, none holding a refused pair.

    Greedy and deterministic: a case starts from the first uncovered pair (in factor order) and each other
    factor takes the value that covers the most uncovered pairs with the values already chosen (ties: the
    earlier value)."""
    names = list(factors)
    uncovered = all_pairs(factors, refused)

    def key(p: Pair) -> tuple[Any, ...]:
        return tuple(sorted((names.index(f), list(factors[f]).index(v)) for f, v in p))

    cases: list[dict[str, str]] = []
    while uncovered:
        first = min(uncovered, key=key)
        case = dict(first)
        for f in sorted(names, key=lambda n: -len(factors[n])):
            if f in case:
                continue
            best, gain = None, -1
            for v in factors[f]:
                if any(pair((f, v), (g, w)) in refused for g, w in case.items()):
                    continue
                n = sum(pair((f, v), (g, w)) in uncovered for g, w in case.items())
                if n > gain:
                    best, gain = v, n
            assert best is not None, f"no value of {f} fits {case}"
            case[f] = best
        uncovered -= {pair((f, case[f]), (g, case[g])) for f, g in combinations(names, 2)}
        cases.append({f: case[f] for f in names})
    return cases


def covered(cases: list[dict[str, str]]) -> set[Pair]:
    return {pair((f, c[f]), (g, c[g])) for c in cases for f, g in combinations(list(c), 2)}


# ----- the factors ------------------------------------------------------------------------------------------

CURRICULUM = {"levels": [{"max_turns": 2}, {"max_turns": 3}], "window": 4, "min_episodes": 4,
              "promote_at": 0.25, "demote_at": 0.0}  # fmt: skip
# three multi-turn envs with env nodes: VowelCount's tool turn then answer (2 turns, or 3), Counter's tool
ENVS: dict[str, dict[str, Any]] = {
    "vowel2": {"env_ids": [FAKE_ENV], "env_kwargs": {}},
    "vowel3": {"env_ids": [FAKE_ENV], "env_kwargs": {"max_turns": 3}},
    "counter": {"env_ids": [COUNTER], "env_kwargs": {"target": 1}},  # up to 8 turns: the token budget cuts it
}
MODEL: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"lora_r": 4, "lora_targets": ["q_proj", "v_proj"]},
    "ckpt": {"gradient_checkpointing": True},
}
OPT: dict[str, dict[str, Any]] = {
    "1x1": {"epochs": 1, "minibatches": 1},
    "2x1": {"epochs": 2, "minibatches": 1},
    "1x2": {"epochs": 1, "minibatches": 2},
}
# model families (the runner builds each tiny, `tiny_family`): Qwen2 with tied embeddings and q/k/v biases,
# Gemma2 with logit soft-capping and a sliding window, Phi3 with fused qkv/gate_up projections
FAMILY: dict[str, dict[str, Any]] = {"llama": {}, "qwen2": {}, "gemma2": {}, "phi3": {}}
RESUME: dict[str, dict[str, Any]] = {"no": {}, "yes": {}}  # (the runner kills the run after step 1)
LOGGING: dict[str, dict[str, Any]] = {
    "quiet": {},
    "saves": {"save_every": 1, "eval_every": 1, "save_evals": True, "save_rollouts": 1},
}
SAMPLING: dict[str, dict[str, Any]] = {
    "t1": {}, "top_p": {"top_p": 0.9}, "t0.7": {"temperature": 0.7}, "greedy": {"temperature": 0.0},
}  # fmt: skip
# batch shapes: tasks x budget and rows per micro-batch (one task, an odd group, one row per forward)
SIZES: dict[str, dict[str, Any]] = {
    "2x4": {},
    "1x3": {"prompts_per_step": 1, "budget": 3, "micro_batch_rows": 1},
    "3x2": {"prompts_per_step": 3, "budget": 2, "micro_batch_rows": 8},
}
# importance-weight and entropy options
IS: dict[str, dict[str, Any]] = {
    "default": {},
    "seq-trunc": {"is_mode": "sequence_truncate", "is_min": 0.5, "is_max": 1.5},
    "token-mask": {"is_mode": "token_mask"},
    "none+ent": {"is_mode": "none", "entropy_coef": 0.01},
}
# servers: engine=vllm with rollout servers, here `toolgym serve --weight-updates` over a copy of the run's model
# (`rollout_server`), the weights pushed after each update by disk
ENGINE: dict[str, dict[str, Any]] = {
    "hf": {"engine": "hf"}, "ours": {"engine": "fast"}, "servers": {"engine": "vllm", "weight_sync": "disk"},
}  # fmt: skip
# sampling noise keyed by each path (`rollout_keys`: our engine's keyed race, vLLM's per-request seed)
KEYS: dict[str, dict[str, Any]] = {"off": {}, "on": {"rollout_keys": True}}

GRPO_FACTORS: Factors = {
    "estimator": {e: {"estimator": e} for e in (
        "grpo", "dr_grpo", "rloo", "gigpo", "hgpo", "tree", "spo_std", "treerl", "treepo", "igpo", "hiper")},
    "branching": {
        "none": {},
        "turn_entropy": {"branching": "turn_entropy", "branch_kwargs": {"entropy_weight": 0.0, "tau": 0.0}},
        "token_entropy": {"branching": "token_entropy"},
        "branching_score": {"branching": "branching_score"},
        "fixed_segments": {"branching": "fixed_segments", "branch_kwargs": {"segment_tokens": 3, "iterations": 1}},
    },
    "env": ENVS,
    "async": {
        "sync": {},
        "stale2-batch": {"max_staleness": 2, "async_admission": "batch"},
        "stale2-tree": {"max_staleness": 2, "async_admission": "tree"},
    },
    "update": {
        "padded": {"packing": "off"},
        "packed": {"packing": "on", "share_prefix": "off"},
        "packed-shared": {"packing": "on", "share_prefix": "on"},
    },
    "replay": {"off": {}, "replay+pool": {"replay": True, "task_pool": 3, "task_filter_refresh": 1}},
    "epo": {"off": {}, "on": {"epo": True, "epo_alpha": 0.05}},
    "curriculum": {"off": {}, "on": {"curriculum": CURRICULUM}},
    "shaping": {
        "none": {},
        "kl-loss": {"kl_coef": 0.05},
        "kl-reward": {"kl_coef": 0.05, "kl_in_reward": True, "kl_estimator": "k1"},
        "overlong+aepo": {"overlong_buffer": 100, "overlong_factor": 0.5, "entropy_advantage": 0.2},
    },
    "filters": {
        "default": {},
        "refill": {"refill": True, "max_gen_batches": 2},
        "void+mask": {"filter_void": True, "mask_truncated_completions": True},
        "remove_clip": {"remove_clip": True},
        "acc": {"filter_zero_variance": False, "acc_filter_low": 0.1, "acc_filter_high": 0.9},
    },
    "shared": {"repeat": {}, "once": {"shared": "once"}},
    "loss": {
        "ppo": {},
        "cispo": {"objective": "cispo", "cispo_max": 3.0},
        "turn-ratio": {"ratio_level": "turn", "agg": "seq_mean_token_sum", "dual_clip": 0.0},
        "seq-llds": {"ratio_level": "sequence", "agg": "constant", "llds_coef": 0.2, "top_entropy_quantile": 0.5},
    },
    "opt": OPT,
    "resume": RESUME,
    "engine": ENGINE,
    "model": MODEL,
    "logging": LOGGING,
    "sampling": SAMPLING,
    "family": FAMILY,
    "sizes": SIZES,
    "is": IS,
    "keys": KEYS,
}  # fmt: skip

PPO_FACTORS: Factors = {
    "critic": {"token": {}, "turn": {"critic": "turn"}, "hiper": {"critic": "hiper"}},
    "async": {
        "sync": {},
        "stale2-batch": {"max_staleness": 2, "async_admission": "batch"},
        "stale2-tree": {"max_staleness": 2, "async_admission": "tree", "is_min": 0.5},
    },
    "gae": {
        "1/0.95": {},
        "0.9/1": {"gamma": 0.9, "lam": 1.0},
        "1/0": {"lam": 0.0},
    },
    "value": {
        "whiten+clip": {},
        "raw": {"whiten_advantages": False},
        "noclip": {"vf_clip": 0.0, "vf_coef": 1.0},
    },
    "env": ENVS,
    "kl": {
        "none": {},
        "kl-loss": {"kl_coef": 0.05},
        "kl-reward": {"kl_coef": 0.05, "kl_in_reward": True, "kl_estimator": "k2"},
    },
    "addons": {
        "none": {},
        "replay+pool": {"replay": True, "task_pool": 3, "task_filter_refresh": 1},
        "epo": {"epo": True, "epo_alpha": 0.05},
    },
    "loss": {
        "token": {},
        "turn-ratio": {"ratio_level": "turn", "agg": "seq_mean"},
        "seq-mask": {
            "ratio_level": "sequence",
            "is_mode": "sequence_mask",
            "dual_clip": 0.0,
            "entropy_coef": 0.01,
        },
    },
    "opt": OPT,
    "resume": RESUME,
    "engine": ENGINE,
    "model": MODEL,
    "logging": {"quiet": {}, "saves": {"save_every": 1, "eval_every": 1, "save_evals": True}},
    "sampling": SAMPLING,
    "family": FAMILY,
    "sizes": SIZES,
    "keys": KEYS,
}

# pairs the config refuses at construction: (factor, value) x (factor, value) -> words its message must hold
ASYNC = ("stale2-batch", "stale2-tree")
GRPO_REFUSED: dict[Pair, tuple[str, str]] = {
    pair(("engine", "servers"), ("model", "lora")): ("engine=vllm", "lora_r"),
    **{pair(("async", a), ("replay", "replay+pool")): ("max_staleness", "task_pool") for a in ASYNC},
    **{pair(("async", a), ("curriculum", "on")): ("max_staleness", "curriculum") for a in ASYNC},
    **{pair(("async", a), ("filters", "refill")): ("max_staleness", "refill") for a in ASYNC},
    pair(("env", "vowel3"), ("curriculum", "on")): ("curriculum", "env_kwargs"),  # both set max_turns
    pair(("engine", "hf"), ("keys", "on")): ("rollout_keys", "engine hf"),  # (HF's batched generate: no keys)
}
# pairs refused when the run starts (the model's family is known only then), with a ConfigError before any step
AT_START: dict[Pair, tuple[str, str]] = {
    **{pair(("engine", "ours"), ("family", f)): ("engine=fast", f) for f in ("gemma2", "phi3")},
    pair(("model", "lora"), ("family", "phi3")): ("lora_targets", "qkv_proj"),  # (phi3 fuses q, k and v)
}
GRPO_REFUSED |= AT_START
PPO_REFUSED: dict[Pair, tuple[str, str]] = {
    **AT_START,
    pair(("engine", "servers"), ("model", "lora")): ("engine=vllm", "lora_r"),
    **{pair(("async", a), ("addons", "replay+pool")): ("max_staleness", "task_pool") for a in ASYNC},
    pair(("engine", "hf"), ("keys", "on")): ("rollout_keys", "engine hf"),
}

GRPO_CASES = pairwise(GRPO_FACTORS, set(GRPO_REFUSED))
PPO_CASES = pairwise(PPO_FACTORS, set(PPO_REFUSED))
SAMPLE_EVERY = 2  # the default run: every other case of each matrix (cases 0, 2, 4, ...)
FULL = os.environ.get("TOOLGYM_FULL_MATRIX", "") not in ("", "0")


def sampled(cases: list[dict[str, str]]) -> list[Any]:
    return [
        pytest.param(
            i, marks=() if FULL or i % SAMPLE_EVERY == 0 else pytest.mark.skip("TOOLGYM_FULL_MATRIX=1")
        )
        for i in range(len(cases))
    ]


def options(factors: Factors, case: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, v in case.items():
        for k, x in factors[f][v].items():
            assert k not in out, f"factors overlap on {k}"
            out[k] = x
    return out


BASE: dict[str, Any] = dict(
    prompts_per_step=2, budget=4, max_new_tokens=6, max_total_tokens=256, lr=1e-2, device="cpu",
    tensorboard=False, progress=False, eval_episodes=1, micro_batch_rows=4,
)  # fmt: skip


# ----- the generator's own checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("factors,refused", [(GRPO_FACTORS, GRPO_REFUSED), (PPO_FACTORS, PPO_REFUSED)])
def test_every_accepted_pair_is_covered_and_no_case_holds_a_refused_one(
    factors: Factors, refused: dict[Pair, Any]
) -> None:
    cases = pairwise(factors, set(refused))
    assert cases == pairwise(factors, set(refused))  # deterministic
    got = covered(cases)
    assert all_pairs(factors, set(refused)) <= got
    assert not got & set(refused)


def test_the_generator_on_a_known_array() -> None:
    """Three two-valued factors need 4 cases (the smallest covering array); a refused pair is never used."""
    f: Factors = {n: {"a": {}, "b": {}} for n in ("x", "y", "z")}
    assert len(pairwise(f, set())) == 4
    cases = pairwise(f, {pair(("x", "a"), ("y", "a"))})
    assert all(not (c["x"] == "a" and c["y"] == "a") for c in cases)


# ----- refused pairs: a ConfigError at construction that names both options -------------------------------------


@pytest.mark.option_matrix
@pytest.mark.parametrize(
    "algo,refused",
    [("grpo", p) for p in sorted(set(GRPO_REFUSED) - set(AT_START), key=sorted)]
    + [("ppo", p) for p in sorted(set(PPO_REFUSED) - set(AT_START), key=sorted)],
    ids=lambda x: x if isinstance(x, str) else "x".join(v for _, v in sorted(x)),
)
def test_refused_pairs_fail_at_config_load(algo: str, refused: Pair) -> None:
    from toolgym.trainers.grpo_config import GRPOConfig
    from toolgym.trainers.ppo_config import PPOConfig

    factors, words = (GRPO_FACTORS, GRPO_REFUSED) if algo == "grpo" else (PPO_FACTORS, PPO_REFUSED)
    opts = {k: v for f, val in refused for k, v in factors[f][val].items()}
    with pytest.raises(ConfigError) as err:
        (GRPOConfig if algo == "grpo" else PPOConfig)(
            **BASE, output_dir="unused", **{**ENVS["vowel2"], **opts}
        )
    for word in words[refused]:
        assert word in str(err.value), (word, str(err.value))


def tiny_family(family: str, vocab: int, seed: int = 0) -> Any:
    """A tiny random model of `family` (conftest's Llama, or one of FAMILY's others of the same size)."""
    if family == "llama":
        return tiny_model(vocab, seed)
    import transformers as tf

    size = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config, cls = {
        "qwen2": (tf.Qwen2Config(**size, tie_word_embeddings=True), tf.Qwen2ForCausalLM),
        "gemma2": (tf.Gemma2Config(**size, head_dim=8, sliding_window=16, final_logit_softcapping=30.0,
                                   attn_logit_softcapping=50.0), tf.Gemma2ForCausalLM),
        "phi3": (tf.Phi3Config(**size), tf.Phi3ForCausalLM),
    }[family]  # fmt: skip
    torch.manual_seed(seed)
    return cls(config)


@pytest.mark.option_matrix
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize(
    "refused", sorted(AT_START, key=sorted), ids=lambda p: "x".join(v for _, v in sorted(p))
)
def test_refused_pairs_fail_when_the_run_starts(
    refused: Pair, algo: str, tmp_path: Path, tokenizer: Any
) -> None:
    """The family is known only when the model is: a ConfigError naming both before any step."""
    from toolgym.trainers import grpo, ppo

    register_fake_env()
    factors = GRPO_FACTORS if algo == "grpo" else PPO_FACTORS
    family = dict(refused)["family"]
    opts = {k: v for f, val in refused for k, v in factors[f][val].items()}
    config, train = (grpo.GRPOConfig, grpo.train) if algo == "grpo" else (ppo.PPOConfig, ppo.train)
    cfg = config(steps=1, output_dir=str(tmp_path), **BASE, **ENVS["vowel2"], **opts)
    with pytest.raises(ConfigError) as err:
        train(cfg, tiny_family(family, len(tokenizer)), tokenizer)
    for word in AT_START[refused]:
        assert word in str(err.value), (word, str(err.value))
    assert not (tmp_path / "metrics.jsonl").is_file() or not records(tmp_path)


# refusals of options outside the factors (self-play needs a seat env, so it is not a factor)
SELFPLAY = {
    "env_ids": ["toolgym/Werewolf-v0"],
    "env_kwargs": {"n_players": 5},
    "selfplay": {"learner_seats": 2},
}
OTHER_REFUSED: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("grpo", {**SELFPLAY, "max_staleness": 1}, ("selfplay", "max_staleness")),
    ("grpo", {**SELFPLAY, "selfplay": {"learner_seat": 2}}, ("selfplay", "learner_seat")),
    ("ppo", SELFPLAY, ("selfplay", "GRPO only")),
    ("grpo", {"curriculum": {"knobs": {"max_turns": [2, 3]}, "env_ids": ["tests/Other-v0"]}}, ("curriculum", "env_ids")),
    ("grpo", {"rollout_ranks": 1}, ("rollout_ranks", "max_staleness")),
]  # fmt: skip


@pytest.mark.option_matrix
@pytest.mark.parametrize("algo,opts,words", OTHER_REFUSED, ids=[str(i) for i in range(len(OTHER_REFUSED))])
def test_other_refusals_fail_at_config_load(algo: str, opts: dict[str, Any], words: tuple[str, ...]) -> None:
    from toolgym.trainers.grpo_config import GRPOConfig
    from toolgym.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError) as err:
        (GRPOConfig if algo == "grpo" else PPOConfig)(
            **BASE, output_dir="unused", **{**ENVS["vowel2"], **opts}
        )
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_selfplay_makes_branching_inert() -> None:
    from toolgym.trainers.grpo_config import GRPOConfig

    msgs = GRPOConfig(**BASE, output_dir="unused", **SELFPLAY, branching="turn_entropy").inert_options()
    assert any("inert with selfplay" in m for m in msgs)


# ----- run cases --------------------------------------------------------------------------------------------


def finite_advantages(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[int]:
    """Wraps `module.policy_loss`: every call's advantages (masked) and loss must be finite; counts calls."""
    calls = [0]
    inner = module.policy_loss

    def checked(pb: Any, *args: Any, **kwargs: Any) -> Any:
        adv = pb.advantages * pb.mask
        assert torch.isfinite(adv).all(), "non-finite advantage"
        loss, stats = inner(pb, *args, **kwargs)
        assert torch.isfinite(loss).all(), "non-finite policy loss"
        calls[0] += 1
        return loss, stats

    monkeypatch.setattr(module, "policy_loss", checked)
    return calls


def run_case(
    config: Callable[..., Any], train: Callable[..., Any], opts: dict[str, Any], resume: bool, tmp_path: Path,
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, family: str = "llama",
) -> tuple[Path, dict[str, float]]:  # fmt: skip
    """Two steps; with `resume` also the same run killed after its step-1 checkpoint and resumed from another
    initialisation, whose step 2 must equal the uninterrupted one (metrics and weights)."""
    vocab = len(tokenizer)
    opts = {**BASE, "save_every": 1, **opts} if resume else {**BASE, **opts}

    def run(model: Any, out: str, **more: Any) -> dict[str, float]:
        with rollout_server(opts, model, tokenizer, tmp_path / "weights") as servers:
            return train(
                config(steps=2, output_dir=str(tmp_path / out), **opts, **servers, **more), model, tokenizer
            )

    straight = tiny_family(family, vocab)
    metrics = run(straight, "a")
    if not resume:
        return tmp_path / "a", metrics
    with dies_after_save(monkeypatch, step=1):
        run(tiny_family(family, vocab), "b")
    resumed = tiny_family(family, vocab, seed=3)  # everything must come from the checkpoint
    run(resumed, "b", resume=True)
    a, b = records(tmp_path / "a")[-1], records(tmp_path / "b")[-1]
    assert a["step"] == b["step"] == 2
    timing = ("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")
    if exact(opts):
        diff = {k: (a[k], b.get(k)) for k in a if not k.startswith(timing) and not same(a[k], b.get(k))}
        assert not diff, f"resumed step 2 differs: {diff}"
        for (n, p1), p2 in zip(straight.named_parameters(), resumed.parameters(), strict=True):
            assert torch.equal(p1, p2), n
    # (otherwise the batches differ, and with them which groups the filters keep: check_run checks step 2)
    return tmp_path / "b", metrics


@contextlib.contextmanager
def rollout_server(
    opts: dict[str, Any], model: Any, tokenizer: Any, folder: Path
) -> Iterator[dict[str, Any]]:
    """For an engine=vllm case: a `toolgym serve --weight-updates` server over a copy of the run's model (the
    trainer pushes its weights there: the start ones, then after every update), and the options that point
    the run at it; nothing for the other engines."""
    if opts.get("engine") != "vllm":
        yield {}
        return
    from toolgym.agents.hf import HFPolicy
    from toolgym.agents.openai_server import PolicyServer

    server = PolicyServer(HFPolicy(copy.deepcopy(model), tokenizer), port=0, weight_updates=True).start()
    try:
        yield {"rollout_servers": [server.url], "weight_sync_folder": str(folder)}
    finally:
        server.close()


def exact(opts: dict[str, Any]) -> bool:
    """Whether a resumed run must repeat the uninterrupted one bit for bit. Not asynchronous batches (they
    depend on thread timing), nor continuous rollouts with forks inside turns, on either engine: a fork joins
    the next generation batch when its tree's other paths end, and env calls finishing in between decide
    which batch, so the one sampling generator's draws can go to other rows (seen about 1 run in 8 on CPU
    with our engine, and in CI with hf: case 8; per-sequence sampling seeds would remove it)."""
    forks_in_turns = opts.get("branching") in ("token_entropy", "fixed_segments")
    # (rollout servers sample with their own generators: vLLM's runs are seeded once, not per request)
    return not opts.get("max_staleness") and not forks_in_turns and opts.get("engine") != "vllm"


def same(x: Any, y: Any) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def documented(key: str) -> bool:
    """A metric name with a row in docs/trainer.md's table (`<name>` placeholders match any name)."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text()
    table = text.split("## Logged metrics", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"`((?:charts|losses|rollout|eval|time|curriculum)/[^`]+)`", table)
    return any(re.fullmatch(re.sub(r"<[a-z]+>", "[a-z_]+", re.escape(n)), key) for n in names)


def check_run(out: Path, metrics: dict[str, float], calls: list[int]) -> None:
    """`out` and, for a resume case, the uninterrupted run beside it (`a`): both steps logged, every name
    namespaced and documented, losses finite; a policy loss computed in some run is logged by it."""
    from toolgym.trainers.metrics_log import NAMESPACES

    folders = sorted({out, out.parent / "a"})
    logged = [r for f in folders for r in records(f)]
    for f in folders:
        assert [r["step"] for r in records(f) if r["step"] > 0] == [1, 2]
    keys = set(metrics) | {k for r in logged for k in r if k != "step"}
    assert not sorted(k for k in keys if not k.startswith(NAMESPACES) or not documented(k))
    for r in logged:
        for k, v in r.items():
            if (
                k.startswith("losses/") and k != "losses/explained_variance"
            ):  # (nan: returns that do not vary)
                assert math.isfinite(v), (r["step"], k, v)
    assert "charts/episode_reward" in metrics and math.isfinite(metrics["charts/episode_reward"])
    if calls[0]:
        assert any("losses/policy" in r for r in logged)


def check_engine(case: dict[str, str], err: str) -> None:
    """engine=fast is never a silent no-op: the run says it rolls out on our engine."""
    assert ("rollouts use the fast engine" in err) == (case["engine"] == "ours"), err[-2000:]
    assert ("vLLM server(s), weight sync disk" in err) == (case["engine"] == "servers"), err[-2000:]


@pytest.mark.option_matrix
@pytest.mark.parametrize("index", sampled(GRPO_CASES))
def test_grpo_option_matrix(
    index: int, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    from toolgym.trainers import grpo_update
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    case = GRPO_CASES[index]
    calls = finite_advantages(monkeypatch, grpo_update)
    opts = options(GRPO_FACTORS, case)
    out, metrics = run_case(
        GRPOConfig,
        train_grpo,
        opts,
        case["resume"] == "yes",
        tmp_path,
        tokenizer,
        monkeypatch,
        case["family"],
    )
    check_run(out, metrics, calls)
    check_engine(case, capfd.readouterr().err)


@pytest.mark.option_matrix
@pytest.mark.parametrize("index", sampled(PPO_CASES))
def test_ppo_option_matrix(
    index: int, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    from toolgym.trainers import ppo
    from toolgym.trainers.ppo import PPOConfig

    register_fake_env()
    case = PPO_CASES[index]
    calls = finite_advantages(monkeypatch, ppo)
    opts = options(PPO_FACTORS, case)
    out, metrics = run_case(
        PPOConfig, ppo.train, opts, case["resume"] == "yes", tmp_path, tokenizer, monkeypatch, case["family"]
    )
    check_run(out, metrics, calls)
    assert calls[0] > 0  # PPO keeps every row: the loss always runs
    check_engine(case, capfd.readouterr().err)


def test_run_options_that_do_nothing_are_warned() -> None:
    """Engine, LoRA and update options that a setting makes inert say so (they were silent)."""
    from toolgym.trainers.grpo_config import GRPOConfig
    from toolgym.trainers.ppo_config import PPOConfig

    assert not GRPOConfig().inert_options() and not PPOConfig().inert_options()
    msgs = GRPOConfig(device="cpu", compile="on", share_prefix="on", lora_alpha=8, engine="hf", engine_memory=0.5,
                      fsdp_offload=True, weight_sync="disk").inert_options()  # fmt: skip
    for word in (
        "compile=on",
        "share_prefix=on",
        "lora_alpha",
        "engine_memory",
        "fsdp_offload",
        "weight_sync:",
    ):
        assert any(m.startswith(word) for m in msgs), word
    assert any(
        m.startswith("weight_sync_folder") for m in GRPOConfig(weight_sync_folder="/x").inert_options()
    )
    assert any(m.startswith("save_rollouts") for m in PPOConfig(save_rollouts=1).inert_options())
