"""Red-team tests of the paths the Werewolf GPU run takes, on CPU with ``engine: fast``: self-play's continuous
loop over the learner's and the frozen seats' engines (frozen weights that never move, token-exact rows under
early ends and garbage, engine faults, no engine left alive between runs) and LSPO's collection through our
engine (two iterations end to end, DPO after the engine is gone, resume, determinism)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import toolgym  # noqa: E402,F401
from tests.trainers.conftest import (  # noqa: E402
    capture_selfplay_rollers,
    fail_turn_once,
    rows_exact,
    tiny_model,
    tiny_tokenizer,
)
from toolgym.agents.policy import SamplingParams  # noqa: E402
from toolgym.trainers.rollout import RolloutConfig, RolloutTask  # noqa: E402
from toolgym.trainers.selfplay import SelfPlayRollout  # noqa: E402
from toolgym.trainers.tree import env_error, flatten  # noqa: E402

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}
PACKED = ("embed", "lm_head", "norm", "ln1", "ln2", "wqkv", "wo", "wgu", "wd")


def _model(seed: int = 0) -> tuple[Any, Any]:
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=seed)
    model.config.max_position_embeddings = 8192
    return model, tok


def _engine_policy(seed: int = 0, slots: int = 8) -> Any:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    model, tok = _model(seed)
    return EnginePolicy(model, tok, slots=slots, capacity=8192)


def _greedy(policy: Any, prompts: list[list[int]]) -> list[list[int]]:
    return [g.token_ids for g in policy.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))]


def _grpo_cfg(tmp_path: Path, start: Path, **over: Any) -> Any:
    from toolgym.trainers import grpo

    kw: dict[str, Any] = dict(
        env_ids=[ENV], env_kwargs=SMALL, model=str(start), steps=3, prompts_per_step=2, budget=2,
        max_new_tokens=4, max_total_tokens=4000, lr=0.5, device="cpu", tensorboard=False, progress=False,
        eval_every=0, eval_episodes=1, micro_batch_rows=4, output_dir=str(tmp_path / "run"), engine="fast",
        save_every=1, filter_zero_variance=False, weight_decay=0.5,  # (decay moves a model that never wins)
        selfplay={"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 3, "snapshot": "initial"},
    )  # fmt: skip
    kw.update(over)
    return grpo.GRPOConfig(**kw)


# ----- the frozen seats never change ----------------------------------------------------------------------------
def test_frozen_engine_plays_the_snapshot_through_training_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GRPO with a large learning rate moves the learner; the frozen engine's packed weights stay the
    snapshot's bit for bit, its greedy answers are the snapshot's, it never packs from the learner (nor
    re-packs at all), and a resumed run's frozen seats are the same snapshot (not the checkpoint)."""
    from toolgym.agents.engine import weights as weights_mod
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.hf import load_model
    from toolgym.trainers import grpo

    model, tok = _model()
    start = tmp_path / "start"
    model.save_pretrained(start)
    tok.save_pretrained(start)
    reference, _ = load_model(str(start), device="cpu", dtype="float32")
    reference.config.max_position_embeddings = 8192
    snap = EnginePolicy(reference, tok, slots=4, capacity=8192)
    prompts = [tok.encode("system user aeiou"), tok.encode("assistant tool 2146 <tool_call>")]
    want = _greedy(snap, prompts)

    packs: list[tuple[int, bool]] = []  # (id of the model packed from, changed)
    original = weights_mod.PackedWeights.refresh

    def counting(self: Any, force: bool = False) -> bool:
        changed = original(self, force)
        packs.append((id(self.model), changed))
        return changed

    monkeypatch.setattr(weights_mod.PackedWeights, "refresh", counting)
    seen = capture_selfplay_rollers(monkeypatch)
    before = [p.detach().clone() for p in model.parameters()]
    grpo.train(_grpo_cfg(tmp_path, start), model, tok)
    (used,) = seen
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))  # it trained
    frozen = used.frozen
    assert isinstance(frozen, EnginePolicy) and frozen.model is not model
    assert frozen.engine.stats.decode_tokens > 0  # the frozen seat played
    for name in PACKED:
        assert torch.equal(getattr(frozen.engine.weights, name), getattr(snap.engine.weights, name)), name
    assert _greedy(frozen, prompts) == want
    frozen_packs = [changed for mid, changed in packs if mid == id(frozen.model)]
    assert frozen_packs.count(True) == 1, frozen_packs  # packed once, when built; never again
    learner_packs = [changed for mid, changed in packs if mid == id(model)]
    assert learner_packs.count(True) >= 3  # the learner's engine follows every update

    # resume: 2 more steps from the checkpoint; the frozen seats still play the starting model
    grpo.train(_grpo_cfg(tmp_path, start, steps=5, resume=True), model, tok)
    resumed = seen[-1].frozen
    assert len(seen) == 2 and resumed is not frozen
    for name in PACKED:
        assert torch.equal(getattr(resumed.engine.weights, name), getattr(snap.engine.weights, name)), name
    assert _greedy(resumed, prompts) == want
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 5


# ----- rows are token-exact under the continuous loop ---------------------------------------------------------
def _half_legal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two of three text-seat turns are replaced, for the table only, by the expert's legal move (a random
    model never makes one, so its games never get past the first seat to move): the games go on, seats die,
    tables end every way; the rows keep what was sampled (a seat's own answer is not in its news)."""
    from toolgym.envs.multiagent.selfplay import SelfPlayTable

    original = SelfPlayTable.act

    def act(self: Any, seat: str, action: Any) -> None:
        if (self.records[seat].turns + len(seat) + int(seat[1:])) % 3:
            action = self.rules.expert_move_text(self.game, seat, self.rng)
        original(self, seat, action)

    monkeypatch.setattr(SelfPlayTable, "act", act)


def test_rows_are_exact_when_tables_end_every_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both engines (the learner's with fewer slots than seats: evictions, held caches, forks of the copies'
    common prompt), garbage turns (an observation and a penalty), seats killed before their first turn (no
    row), tables ended by the token budget and by max_turns_per_seat, games played to their end: each trained
    token's logprob is the learner's given its row, and the rollout's counters agree with the rows."""
    _half_legal(monkeypatch)
    live = _engine_policy(slots=4)
    cfg = RolloutConfig(budget=3, max_new_tokens=6, max_total_tokens=1400)
    options = {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 5}
    roller = SelfPlayRollout(live, cfg, SMALL, options)
    try:
        forest, stats = roller.run([RolloutTask(ENV, s) for s in range(6)], seed=0)
        assert roller.timing["learner_steps"] > 0 and roller.timing["frozen_steps"] > 0
        assert not live.engine.busy() and not roller.frozen.engine.busy()
        eps = [t.nodes[leaf].info["episode"] for t in forest for leaf in t.leaves()]
        ends = {e["truncation"] for e in eps}
        assert {"token_budget", None} <= ends, ends  # (max_turns: the next test)
        assert all(e["episode_reward"] == 0.0 for e in eps if e["truncation"] == "token_budget")
        assert any(e["invalid_turns"] > 0 for e in eps)  # garbage turns were observations, not crashes
        assert any(len(t.leaves()) < cfg.budget for t in forest)  # a seat out before its first turn
        assert live.engine.stats.forked_tokens > 0  # the copies' common prompt was forked
        rows = flatten(forest)
        assert len(rows) == len(eps) and stats.generated_tokens == sum(sum(r.loss_mask) for r in rows)
        assert rows_exact(rows, live.model) == stats.generated_tokens
        assert stats.env_errors == 0
    finally:
        roller.close()


def test_rows_are_exact_when_seats_run_out_of_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_turns_per_seat ends tables early (no side wins); the same exactness, a second run on the same
    engines (held caches of the last run dropped or reused, never wrong)."""
    _half_legal(monkeypatch)
    live = _engine_policy(slots=16)
    cfg = RolloutConfig(budget=2, max_new_tokens=5, max_total_tokens=3000)
    roller = SelfPlayRollout(
        live, cfg, SMALL, {"learner_seats": 2, "frozen_seats": 2, "max_turns_per_seat": 3}
    )
    try:
        for seed in (0, 1):
            forest, stats = roller.run([RolloutTask(ENV, s) for s in (3, 4, 5)], seed=seed)
            eps = [t.nodes[leaf].info["episode"] for t in forest for leaf in t.leaves()]
            assert "max_turns" in {e["truncation"] for e in eps}
            assert all(not e["success"] for e in eps if e["truncated"])
            rows = flatten(forest)
            assert rows_exact(rows, live.model) == stats.generated_tokens > 0
            if seed == 0:  # 12 learner seats in 16 slots: a seat's next turn prefills only its news
                assert live.engine.stats.prefill_tokens < sum(len(r.token_ids) for r in rows)
    finally:
        roller.close()


# ----- faults ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["frozen", "learner"])
def test_a_failed_engine_turn_ends_only_its_table(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _half_legal(monkeypatch)
    live = _engine_policy(slots=16)
    cfg = RolloutConfig(budget=2, max_new_tokens=5, max_total_tokens=3000)
    roller = SelfPlayRollout(
        live, cfg, SMALL, {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 4}
    )
    tasks = [RolloutTask(ENV, s) for s in (0, 1, 2)]
    try:
        engine = (roller.frozen if which == "frozen" else live).engine
        seen = fail_turn_once(engine, at=12)
        forest, stats = roller.run(tasks, seed=0)
        assert seen["seq"] is not None  # the fault happened mid-run
        lost = [(t, leaf) for t in forest for leaf in t.leaves() if env_error(t, leaf)]
        # (one count a learner path the fault ended: a seat never asked for a turn there has no leaf)
        assert lost and stats.env_errors == stats.server_errors == len(lost)
        lost_tables = {(t.meta["seed"], t.nodes[leaf].info["episode"]["tokens"]) for t, leaf in lost}
        assert len({seed for seed, _ in lost_tables}) == 1  # one table's seats only
        ok = [(t, x) for t in forest for x in t.leaves() if not env_error(t, x)]
        assert len(ok) > len(lost) and all(
            t.nodes[x].info["episode"]["truncation"] != "env_error" for t, x in ok
        )
        rows = flatten(forest)
        assert len(rows) == len(ok) and rows_exact(rows, live.model) > 0
        assert not live.engine.busy() and not roller.frozen.engine.busy()
        again, stats2 = roller.run(tasks, seed=0)  # the engine is usable the next run
        assert stats2.env_errors == 0 and flatten(again)
    finally:
        roller.close()


def test_an_engine_error_without_a_turn_ends_the_run_and_leaves_the_engines_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine fault that names no turn (an InfrastructureError, a CUDA error) cannot be pinned on a table:
    the run raises it; nothing is left queued or decoding in either engine and the next run plays."""
    from toolgym.errors import InfrastructureError

    _half_legal(monkeypatch)
    live = _engine_policy(slots=16)
    cfg = RolloutConfig(budget=2, max_new_tokens=5, max_total_tokens=3000)
    roller = SelfPlayRollout(
        live, cfg, SMALL, {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 3}
    )
    tasks = [RolloutTask(ENV, s) for s in (0, 1)]
    try:
        fail_turn_once(roller.frozen.engine, at=5, error=InfrastructureError)
        with pytest.raises(InfrastructureError):
            roller.run(tasks, seed=0)
        for eng in (live.engine, roller.frozen.engine):
            assert not eng.busy() and not eng.queue and not eng.active
        forest, stats = roller.run(tasks, seed=0)
        assert flatten(forest) and stats.env_errors == 0
    finally:
        roller.close()


# ----- memory: nothing of a run's engines outlives it -------------------------------------------------------------
def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def test_engines_and_caches_do_not_outlive_their_grpo_run(tmp_path: Path) -> None:
    """Three self-play GRPO runs in one process (the pipeline's units share one): after each, no engine, KV
    cache or packed weights of it is left (on a GPU each held its KV cache's memory)."""
    from toolgym.agents.engine.engine import Engine
    from toolgym.agents.engine.kv_slots import KVCache
    from toolgym.agents.engine.weights import PackedWeights
    from toolgym.trainers import grpo

    model, tok = _model()
    start = tmp_path / "start"
    model.save_pretrained(start)
    tok.save_pretrained(start)
    base = [_live(k) for k in (Engine, KVCache, PackedWeights)]
    for run in range(3):
        cfg = _grpo_cfg(tmp_path, start, steps=1, output_dir=str(tmp_path / f"run{run}"))
        grpo.train(cfg, model, tok)
        assert [_live(k) for k in (Engine, KVCache, PackedWeights)] == base, run


# ----- LSPO's collection on our engine ------------------------------------------------------------------------
def _lspo_run(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    """Two tiny LSPO iterations with the LLM proposer on engine=fast; (summaries, what each DPO call got:
    its pairs' ids and the engines alive when it started)."""
    from toolgym.agents.engine.engine import Engine
    from toolgym.trainers import dpo
    from toolgym.trainers.lspo.loop import LSPOConfig, run

    calls: list[Any] = []
    original = dpo.train

    def train(cfg: Any, pairs: list[Any], *args: Any) -> Any:
        calls.append(([(p.prompt_ids, p.chosen_ids, p.rejected_ids) for p in pairs], _live(Engine)))
        return original(cfg, pairs, *args)

    monkeypatch.setattr(dpo, "train", train)
    model, tok = _model()
    model.config.max_position_embeddings = 4096
    cfg = LSPOConfig(
        iterations=2, games=2, text_seats=2, candidates=2, n_players=5, k=2, k_public=2, new_k=1,
        cfr_iterations=200, latent_games=4, dpo_epochs=1, batch_size=4, lr=1e-3, max_new_tokens=8,
        max_turns_per_seat=4, proposer="policy", engine="fast", device="cpu", out=str(tmp_path / name),
    )  # fmt: skip
    return run(cfg, model, tok), calls


def test_lspo_on_our_engine_end_to_end_resume_and_determinism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.agents.engine.engine import Engine
    from toolgym.trainers.lspo import loop

    base = _live(Engine)
    summaries, calls = _lspo_run(tmp_path, "a", monkeypatch)
    assert [s["iteration"] for s in summaries] == [1, 2]
    assert all(s["discussion_turns"] > 0 for s in summaries)
    assert calls and all(engines == base for _, engines in calls)  # DPO starts with the engine gone
    assert _live(Engine) == base
    assert all((tmp_path / "a" / f"iter_{i}" / "summary.json").is_file() for i in (1, 2))
    built: list[Any] = []
    monkeypatch.setattr(loop, "_policy", lambda *a: built.append(a))  # a resumed run builds no policy
    again, more = _lspo_run(tmp_path, "a", monkeypatch)
    assert not built and not more and [s["pairs"] for s in again] == [s["pairs"] for s in summaries]
    monkeypatch.undo()
    twice, calls2 = _lspo_run(tmp_path, "b", monkeypatch)  # the same seed in a new folder: the same pairs
    assert [p for p, _ in calls2] == [p for p, _ in calls]
    assert [s["pairs"] for s in twice] == [s["pairs"] for s in summaries]


def test_lspo_prompts_at_and_past_the_engines_capacity() -> None:
    """A model of 900 positions: the engine holds 900 tokens, prompts up to 900 - max_new - 2 are proposed
    for (one of exactly that length fills the slot to its last two positions), longer ones get an empty
    candidate; the collection goes on and the engine ends idle."""
    from toolgym.envs.werewolf.env import WerewolfEnv
    from toolgym.trainers.lspo.loop import LSPOConfig, _policy, collect, policy_proposer

    model, tok = _model()
    model.config.max_position_embeddings = 900
    cfg = LSPOConfig(
        games=3, text_seats=2, candidates=2, n_players=5, max_new_tokens=8, device="cpu", engine="fast"
    )
    policy, _, max_prompt = _policy(model, tok, cfg)
    assert policy.engine.cache.capacity == 900 and max_prompt == 890
    rules = WerewolfEnv(n_players=5, opponents="strong")
    turns, stats = collect(
        rules, policy_proposer(policy, 8, max_prompt), 3, 2, 2, seed=0, max_turns_per_seat=6
    )
    cands = [c for t in turns for c in t.candidates]
    assert stats["other_moves"] > 0 and not policy.engine.busy()
    assert cands and all(c.ids == [] and c.text == "" for c in cands)  # (the discussions' prompts: > 890)
    edge = [7] * max_prompt  # exactly the longest prompt taken: its reply fits
    (g,) = policy.generate([edge], SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    assert 1 <= len(g.token_ids) <= 8 and not policy.engine.busy()


# ----- the GPU job's path on CPU: the Werewolf pipeline with every engine "auto" taken as our engine --------------
def test_the_werewolf_pipeline_with_auto_as_our_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """What `benchmarks/jobs/werewolf.txt` runs on a GPU, where `auto` is our engine: SFT -> evaluation (all
    seeds in one engine batch) -> 2 LSPO iterations proposing through the engine -> evaluation -> self-play GRPO
    with a frozen seat on its own engine -> evaluation, in one process and one call; no unit fails."""
    import dataclasses
    import json
    import sys

    from toolgym.agents.engine import select
    from toolgym.agents.engine.engine import Engine
    from toolgym.trainers import grpo

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from werewolf_pipeline import QUICK, Pipeline

    original = select.choose_engine

    def fast(policy: Any, engine: str, **kwargs: Any) -> Any:
        return original(policy, "fast" if engine == "auto" else engine, **kwargs)

    monkeypatch.setattr(select, "choose_engine", fast)
    monkeypatch.setattr(grpo, "choose_engine", fast)
    model, tok = _model()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    profile = dataclasses.replace(
        QUICK, name="test", model=str(folder), max_total_tokens=6000, sft_episodes=2, lspo_iterations=2,
        lspo_cfr_iterations=100, lspo_latent_games=10, frozen_seats=1, grpo_steps=2, grpo_save_every=1,
        estimates={"sft": 1, "eval": 1, "selfplay": 1, "lspo": 1},
    )  # fmt: skip
    runs = tmp_path / "runs"
    base = _live(Engine)
    code = Pipeline(profile, runs, 900, tmp_path / "summary", str(tmp_path / "res"), baseline=None).run()
    state = json.loads((runs / "pipeline.json").read_text())
    errors = {n: u.get("error", "")[-600:] for n, u in state["units"].items() if u.get("failures")}
    assert code == 0 and not errors, errors
    for stage in ("sft", "lspo", "selfplay"):
        assert (
            json.loads((runs / "eval" / stage / "seed_0.json").read_text())["setup"]["policy"]
            == "EnginePolicy"
        )
    assert json.loads((runs / "selfplay" / "done.json").read_text())["steps"] == 2
    timings = [
        json.loads(x.split("toolgym selfplay: ", 1)[1])
        for x in capfd.readouterr().err.splitlines()
        if "toolgym selfplay: " in x
    ]
    assert len(timings) == 2 and all(t["mode"] == "continuous" for t in timings)
    # (a random seat that keeps its turn can end a table before the frozen seat's first turn)
    assert any(t["frozen_steps"] > 0 for t in timings)
    assert _live(Engine) == base  # every unit's engines went with the unit


def test_both_engines_in_bf16_the_gpu_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's engine dtype on CPU: the learner's engine in bf16 gives the frozen one bf16 too; the loop runs
    and the rows' logprobs are the fp32 model's within bf16's error (the trainer's IS weights absorb it)."""
    from toolgym.agents.engine.engine_policy import EnginePolicy

    _half_legal(monkeypatch)
    model, tok = _model()
    live = EnginePolicy(model, tok, slots=8, capacity=8192, engine_dtype=torch.bfloat16)
    cfg = RolloutConfig(budget=2, max_new_tokens=5, max_total_tokens=3000)
    roller = SelfPlayRollout(
        live, cfg, SMALL, {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 4}
    )
    try:
        assert roller.frozen.engine.weights.wqkv.dtype == torch.bfloat16
        forest, _ = roller.run([RolloutTask(ENV, s) for s in (0, 1, 2)], seed=0)
        assert roller.timing["frozen_steps"] > 0
        for row in flatten(forest):
            ids = torch.tensor([row.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits.float()[0, :-1], -1)
            want = logp.gather(-1, ids[0, 1:, None])[:, 0]
            got = torch.tensor(row.logprobs[1:])
            mask = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
            assert mask.any() and float((want - got)[mask].abs().max()) < 0.05
    finally:
        roller.close()


def test_the_learner_engine_is_sized_for_the_default_learner_seats() -> None:
    """A selfplay config without learner_seats plays 2 learner seats a game (SelfPlayConfig's default): the
    engine is sized for 2 sequences a copy (it was sized for 1: evictions and re-prefills of idle seats)."""
    from toolgym.trainers import grpo

    cfg = grpo.GRPOConfig(env_ids=[ENV], selfplay={"frozen_seats": 1}, device="cpu")
    assert grpo.seats_per_copy(cfg) == 2
    assert (
        grpo.seats_per_copy(grpo.GRPOConfig(env_ids=[ENV], selfplay={"learner_seats": 3}, device="cpu")) == 3
    )
    assert grpo.seats_per_copy(grpo.GRPOConfig(env_ids=[ENV], device="cpu")) == 1


# ----- the GPU path itself (skipped without CUDA; a few seconds on the device) ----------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and bf16 engines: the device's path")
def test_cuda_two_engines_with_graphs_in_one_loop_and_a_fused_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA both engines are bf16 with CUDA graphs (captured mid-loop, each its own pool and generator)
    and Triton decode kernels (head_dim 16); two rollouts with a fused AdamW step between them (it bumps no
    parameter version): rows within bf16's error of the fp32 model, the learner's engine re-packed, the
    frozen one's weights and greedy answers unchanged."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolgym.agents.engine.engine_policy import EnginePolicy

    _half_legal(monkeypatch)
    tok: Any = tiny_tokenizer()
    torch.manual_seed(0)
    conf = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=False,
    )  # fmt: skip
    model: Any = LlamaForCausalLM(conf)
    model = model.to("cuda")
    live = EnginePolicy(model, tok, slots=16, capacity=8192)
    assert live.engine.cuda_graphs and live.engine.dtype == torch.bfloat16
    cfg = RolloutConfig(budget=2, max_new_tokens=6, max_total_tokens=3000)
    roller = SelfPlayRollout(
        live, cfg, SMALL, {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 4}
    )
    frozen = roller.frozen
    assert frozen.engine.cuda_graphs and frozen.engine.dtype == torch.bfloat16
    packed = {n: getattr(frozen.engine.weights, n).clone() for n in PACKED}
    prompts = [tok.encode("system user aeiou"), tok.encode("assistant tool 2146 <tool_call>")]
    want = _greedy(frozen, prompts)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    try:
        for step in range(2):
            forest, stats = roller.run([RolloutTask(ENV, s) for s in (0, 1, 2)], seed=step)
            assert roller.timing["frozen_steps"] > 0 and roller.timing["learner_steps"] > 0
            assert not live.engine.busy() and not frozen.engine.busy() and stats.env_errors == 0
            rows = flatten(forest)
            assert rows
            for row in rows:
                ids = torch.tensor([row.token_ids], device="cuda")
                with torch.no_grad():
                    logp = torch.log_softmax(model(ids).logits.float()[0, :-1], -1)
                got = logp.gather(-1, ids[0, 1:, None])[:, 0].cpu()
                sampled = torch.tensor(row.logprobs[1:])
                mask = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
                assert float((got - sampled)[mask].abs().max()) < 0.1
            loss = model(torch.tensor([rows[0].token_ids], device="cuda")).logits.float().pow(2).mean()
            loss.backward()
            opt.step()  # (fused: the parameters' versions do not move; the step counter does)
            opt.zero_grad()
        assert live.engine.stats.graphs > 0 and frozen.engine.stats.graphs > 0
        live.refresh()
        q = model.model.layers[0].self_attn.q_proj.weight
        assert torch.equal(live.engine.weights.wqkv[0, : q.shape[0]], q.detach().to(torch.bfloat16))
        for name in PACKED:
            assert torch.equal(getattr(frozen.engine.weights, name), packed[name]), name
        assert _greedy(frozen, prompts) == want
    finally:
        roller.close()
