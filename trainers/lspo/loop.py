"""The LSPO iteration: play games and collect discussion candidates -> latent space (build, then expand) ->
CFR on the abstracted game -> DPO pairs from the solver's strategy -> DPO -> the next iteration's policy.

1. Collect. Werewolf games (``SelfPlayTable``): the policy plays ``text_seats`` (the others are the scripted
   ``strong`` players). At each of its discussion turns it proposes ``candidates`` speeches (sampled at
   temperature 1) and one of them, drawn uniformly, is played (the paper's diversity device); night moves and
   votes are one sample. Each discussion turn is kept: the seat's chat (the prompt), its information set's
   parts (``game.info_parts``) and the candidates (their ids, their text and the speech each makes).
   ``proposer="scripted"`` stands in for the LLM on CPU: the candidates are the scripted players' speech
   templates filled for that seat (``game.realise``), the other moves the strong player's.
2. Latent space: every candidate speech (role, text), clustered per role (``space.LatentSpace.build``); from
   the second iteration on, the old space is expanded with the new speeches (``expand``).
3. CFR: outcome-sampling MCCFR on ``game.LatentWerewolf`` (village vs werewolves), ``cfr_iterations``.
4. Pairs: in each kept discussion turn whose information set the solver reached, every candidate gets
   σ̄(I, z(candidate)); the most probable one is chosen, the least probable rejected, when they differ by at
   least ``min_gap``; a candidate that is no legal move at all is rejected against the best (``reject_invalid``).
5. DPO (``toolgym.trainers.dpo``) on the pairs, π_ref = this iteration's starting policy; its ``model/`` is the
   next iteration's policy.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.envs.multiagent.selfplay import SelfPlayTable
from toolgym.envs.werewolf.agents import strong_policy, view_of
from toolgym.envs.werewolf.env import WerewolfEnv
from toolgym.envs.werewolf.expert import move_text
from toolgym.envs.werewolf.rules import WerewolfGame
from toolgym.errors import ConfigError
from toolgym.trainers.gpu_memory import free_gpu_memory
from toolgym.trainers.lspo.cfr import RegretTable, outcome_sampling
from toolgym.trainers.lspo.game import LatentWerewolf, info_parts, key_of, play_latent, realise
from toolgym.trainers.lspo.space import LatentSpace

# the scripted players' speeches as templates (and a werewolf's fake seer claim): the scripted proposer's pool
SCRIPTED_TEMPLATES = (
    "I am the seer. PX is a werewolf.",
    "I am the seer. PX is innocent.",
    "I suspect PX.",
    "I have no information yet.",
    "I have nothing to say.",
)


@dataclass
class Candidate:
    text: str  # what the model wrote (a say() call or plain text)
    speech: str  # the speech it makes ("" when it is no legal discussion move)
    ids: list[int] = field(default_factory=list)  # its sampled ids (LLM proposer)


@dataclass
class DiscussionTurn:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    parts: tuple[str, int, str, tuple[str, ...]]
    candidates: list[Candidate]

    @property
    def role(self) -> str:
        return self.parts[0]


@dataclass
class LSPOConfig:
    model: str = "smollm2-135m"  # the starting policy (an SFT run's model/ folder in practice)
    iterations: int = 3
    games: int = 64  # collected games per iteration
    text_seats: int = 3  # seats the policy plays per game
    candidates: int = 4  # speeches proposed per discussion turn
    n_players: int = 7
    k: int = 4  # latent strategies per role at the start
    k_public: int = 6
    new_k: int = 2  # new clusters per role at each expansion
    cfr_iterations: int = 20_000
    min_gap: float = 0.1
    reject_invalid: bool = True
    beta: float = 0.1
    lr: float = 1e-6
    dpo_epochs: int = 2
    batch_size: int = 16
    max_new_tokens: int = 96
    latent_games: int = 200  # abstracted games that compare σ̄ with the uniform latent strategy (summary only)
    max_turns_per_seat: int = 40  # a text seat that has not ended its game after this many turns abandons it
    fallback: bool = True  # an illegal night move or vote of the policy: the strong scripted player's instead
    proposer: str = "policy"  # policy | scripted (CPU stand-in for the LLM's candidates)
    device: str = "auto"
    # auto: our engine on CUDA (bf16, continuous batching over every table's prompts), HF generation elsewhere;
    # hf | fast (as `toolgym train`'s engine). HF in fp32 made each collection round as slow as its longest turn
    engine: str = "auto"
    seed: int = 0
    out: str = "runs/lspo"

    def validate(self) -> None:
        if self.proposer not in ("policy", "scripted"):
            raise ConfigError(f"proposer must be policy or scripted, got {self.proposer!r}")
        if self.engine not in ("auto", "hf", "fast"):
            raise ConfigError(f"engine must be auto, hf or fast, got {self.engine!r}")
        for name in (
            "iterations", "games", "text_seats", "candidates", "k", "k_public", "cfr_iterations", "max_turns_per_seat",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.candidates < 2:
            raise ConfigError("candidates must be >= 2 (pairs compare two)")


# ----- 1. collect ------------------------------------------------------------------------------------------
Proposer = Callable[[list[tuple[SelfPlayTable, str, int]], np.random.Generator], list[list[Candidate]]]


def scripted_proposer(rules: WerewolfEnv) -> Proposer:
    def propose(
        batch: list[tuple[SelfPlayTable, str, int]], rng: np.random.Generator
    ) -> list[list[Candidate]]:
        out = []
        for table, seat, n in batch:
            view = view_of(table.game, seat)  # type: ignore[arg-type]
            if n == 1:
                out.append([Candidate(move_text(strong_policy(view, rng), rules.action_format), "")])
                continue
            picks = rng.choice(len(SCRIPTED_TEMPLATES), n, replace=n > len(SCRIPTED_TEMPLATES))
            out.append([Candidate(realise(SCRIPTED_TEMPLATES[int(i)], view), "") for i in picks])
        return out

    return propose


def policy_proposer(policy: Any, max_new_tokens: int, max_prompt: int | None = None) -> Proposer:
    """Candidates sampled from `policy`. A prompt longer than `max_prompt` tokens (what the engine holds, less
    the reply) gets an empty candidate: no speech, an illegal move (the fallback's, or the seat's turn spent),
    as a model that ran out of context would do, instead of an error that loses the iteration."""
    from toolgym.agents.policy import SamplingParams

    renderer = policy.renderer

    def propose(
        batch: list[tuple[SelfPlayTable, str, int]], rng: np.random.Generator
    ) -> list[list[Candidate]]:
        prompts, owner = [], []
        for b, (table, seat, n) in enumerate(batch):
            ids = renderer.prompt_ids(table.messages(seat), table.tools)
            prompts += [ids] * n
            owner += [b] * n
        sp = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=int(rng.integers(2**31)))
        fits = [i for i, p in enumerate(prompts) if max_prompt is None or len(p) <= max_prompt]
        gens: list[Any] = [None] * len(prompts)
        for i, g in zip(fits, policy.generate([prompts[i] for i in fits], sp) if fits else [], strict=True):
            gens[i] = g
        out: list[list[Candidate]] = [[] for _ in batch]
        for b, g in zip(owner, gens, strict=True):
            ids = [] if g is None else list(g.token_ids)
            out[b].append(Candidate(renderer.decode(renderer.strip_stop(ids)) if ids else "", "", ids))
        return out

    return propose


def collect(
    rules: WerewolfEnv,
    propose: Proposer,
    games: int,
    text_seats: int,
    candidates: int,
    seed: int,
    max_turns_per_seat: int = 40,
    fallback: bool = True,
) -> tuple[list[DiscussionTurn], dict[str, float]]:
    """Play ``games`` games (module docstring, step 1); the discussion turns and the games' outcomes. A seat
    that keeps making no legal move ends its game after ``max_turns_per_seat`` turns (no side wins). With
    ``fallback`` a night move or vote that is no legal move is replaced by the strong scripted player's (the
    abstracted game plays those moves so too): a policy that cannot yet kill or vote reaches the discussions
    instead of abandoning its games at night."""
    from toolgym.trainers.episodes import EVAL_SEED0

    rng = np.random.default_rng(seed)
    tables = []
    for g in range(games):
        game = rules.new_game()
        game.reset(seed=(seed * 100_003 + g) % EVAL_SEED0)  # training deals stay below the held-out seeds
        seats = sorted(
            rng.choice(game.possible_agents, text_seats, replace=False).tolist(),
            key=game.possible_agents.index,
        )

        def scripted(game: Any, agent: str, r: np.random.Generator) -> Any:
            return rules.opponent_move(game, agent, r)

        tables.append(
            SelfPlayTable(
                rules,
                game,
                seats,
                scripted,
                seed=seed * 100_003 + g + 1,
                max_turns_per_seat=max_turns_per_seat,
            )
        )
    turns: list[DiscussionTurn] = []
    fallbacks = moves = 0
    live = set(range(len(tables)))
    while live:
        batch = []
        for ti in sorted(live):
            seat = tables[ti].next_seat()
            if seat is None:
                live.discard(ti)
                continue
            game = tables[ti].game
            assert isinstance(game, WerewolfGame)  # the tables deal Werewolf games (rules.new_game())
            n = candidates if game.phase == "discussion" else 1
            batch.append((tables[ti], seat, n))
        if not batch:
            break
        for (table, seat, n), cands in zip(batch, propose(batch, rng), strict=True):
            game = table.game
            assert isinstance(game, WerewolfGame)
            if n > 1:
                for c in cands:
                    move, _ = rules.read_move(game, c.text)
                    c.speech = move.text if not isinstance(move, str) and move.kind == "speak" else ""
                messages = [dict(m) for m in table.messages(seat)]
                turns.append(DiscussionTurn(messages, table.tools, info_parts(game, seat), cands))
                table.act(seat, cands[int(rng.integers(len(cands)))].text)
                continue
            text, moves = cands[0].text, moves + 1
            if fallback and not legal(rules, game, seat, text):
                text = move_text(strong_policy(view_of(game, seat), rng), rules.action_format)
                fallbacks += 1
            table.act(seat, text)
    done = [t for t in tables if t.game.done]
    stats = {
        "games": float(len(tables)),
        "finished": float(len(done)),
        "village_wins": sum(t.game.winner == "village" for t in done) / max(len(done), 1),  # type: ignore[attr-defined]
        "discussion_turns": float(len(turns)),
        "invalid_candidates": sum(not c.speech for t in turns for c in t.candidates)
        / max(1, sum(len(t.candidates) for t in turns)),
        "other_moves": float(moves),
        "fallback_moves": fallbacks
        / max(1, moves),  # share of night moves and votes the scripted player made
    }
    return turns, stats


def legal(rules: WerewolfEnv, game: WerewolfGame, seat: str, text: str) -> bool:
    """Whether ``text`` is a move the referee accepts from ``seat`` now."""
    move, _ = rules.read_move(game, text)
    return not isinstance(move, str) and game.illegal_reason(seat, move) is None


# ----- 4. pairs --------------------------------------------------------------------------------------------
@dataclass
class TextPair:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    chosen: Candidate
    rejected: Candidate
    gap: float
    key: Hashable


def preference_pairs(
    turns: Sequence[DiscussionTurn],
    space: LatentSpace,
    table: RegretTable,
    min_gap: float,
    reject_invalid: bool,
) -> list[TextPair]:
    out = []
    for t in turns:
        if t.role not in space.roles:
            continue
        key = key_of(t.parts, space)
        valid = [c for c in t.candidates if c.speech]
        if not table.reached(key) or not valid:  # σ̄ is uniform where CFR never averaged: no preference
            continue
        sigma = table.average(key)
        scored = sorted(
            ((float(sigma[space.role_latent(t.role, c.speech)]), i) for i, c in enumerate(valid)),
            reverse=True,
        )
        (p_hi, hi), (p_lo, lo) = scored[0], scored[-1]
        if p_hi - p_lo >= min_gap:
            out.append(TextPair(t.messages, t.tools, valid[hi], valid[lo], p_hi - p_lo, key))
        if reject_invalid:
            for bad in (c for c in t.candidates if not c.speech):
                out.append(TextPair(t.messages, t.tools, valid[hi], bad, 1.0, key))
    return out


def token_pairs(pairs: Sequence[TextPair], renderer: Any) -> list[Any]:
    """DPO's token pairs: the prompt rendered as the rollout renders it, each response its sampled ids (or
    its text's ids and the end-of-turn token, for the scripted proposer)."""
    from toolgym.trainers.dpo import PreferencePair, response_ids

    def ids(c: Candidate) -> list[int]:
        if not c.ids:
            return response_ids(renderer, c.text)
        eot = renderer.end_of_turn_id
        return c.ids if eot is None or (c.ids and c.ids[-1] in renderer.stop_ids) else [*c.ids, eot]

    return [
        PreferencePair(
            renderer.prompt_ids(p.messages, p.tools), ids(p.chosen), ids(p.rejected), {"gap": p.gap}
        )
        for p in pairs
    ]


# ----- the iterations --------------------------------------------------------------------------------------
COLLECT, BUILD, SOLVE, LATENT, DPO = range(5)  # what a derived seed is for


def derived_seed(seed: int, iteration: int, purpose: int) -> int:
    """A seed for one purpose of one iteration of the run seeded ``seed``, independent of every other (seed,
    iteration, purpose): ``seed + iteration`` made seed 0's iteration 2 replay seed 1's iteration 1, so runs
    of different seeds shared their CFR samples and DPO shuffles and their spread was understated.

    >>> derived_seed(0, 2, SOLVE) != derived_seed(1, 1, SOLVE)
    True
    """
    return int(np.random.SeedSequence([seed, iteration, purpose]).generate_state(1)[0])


def solve(space: LatentSpace, iterations: int, n_players: int, seed: int) -> RegretTable:
    return outcome_sampling(
        lambda r: LatentWerewolf(space, r, n_players), iterations, np.random.default_rng(seed)
    )


def run(cfg: LSPOConfig, model: Any = None, tokenizer: Any = None) -> list[dict[str, Any]]:
    """``cfg.iterations`` LSPO iterations; each writes ``out/iter_N/`` (space.json, space.pkl, summary.json,
    model/) and the list of summaries is returned. Iterations already finished in ``out`` are read back, not
    run again, so ``--iterations 1``, then 2, then 3 continue one run (each command under the time limit)."""
    from toolgym.trainers.dpo import DPOConfig
    from toolgym.trainers.dpo import train as train_dpo

    cfg.validate()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rules = WerewolfEnv(n_players=cfg.n_players, opponents="strong")
    space: LatentSpace | None = None
    current: Any = model if model is not None else cfg.model
    summaries = []
    for it in range(1, cfg.iterations + 1):
        done = out / f"iter_{it}"
        if (done / "summary.json").is_file() and (
            done / "space.pkl"
        ).is_file():  # resume: a finished iteration
            space = pickle.loads((done / "space.pkl").read_bytes())
            summaries.append(json.loads((done / "summary.json").read_text()))
            if (done / "model" / "config.json").is_file():
                current = str(done / "model")
            continue
        t0 = time.perf_counter()
        folder = out / f"iter_{it}"
        folder.mkdir(parents=True, exist_ok=True)
        policy, hf, max_prompt = _policy(current, tokenizer, cfg)
        propose = (
            scripted_proposer(rules)
            if cfg.proposer == "scripted"
            else policy_proposer(policy, cfg.max_new_tokens, max_prompt)
        )
        import torch

        with torch.no_grad():
            turns, stats = collect(
                rules, propose, cfg.games, cfg.text_seats, cfg.candidates, derived_seed(cfg.seed, it, COLLECT),
                cfg.max_turns_per_seat, cfg.fallback,
            )  # fmt: skip
        t_collect = time.perf_counter() - t0
        if policy is not hf:  # the engine's KV cache and packed weights go back before DPO
            del propose  # (its closure holds the engine too)
            policy = hf
            free_gpu_memory()
        speeches = [(t.role, c.speech) for t in turns for c in t.candidates if c.speech]
        if not speeches:
            raise ConfigError(f"iteration {it}: no candidate was a legal speech; SFT the policy first")
        space = (
            LatentSpace.build(speeches, cfg.k, cfg.k_public, derived_seed(cfg.seed, it, BUILD))
            if space is None
            else space.expand(speeches, cfg.new_k, derived_seed(cfg.seed, it, BUILD))
        )
        t1 = time.perf_counter()
        table = solve(space, cfg.cfr_iterations, cfg.n_players, derived_seed(cfg.seed, it, SOLVE))
        t_cfr = time.perf_counter() - t1
        sigma = table.policy()
        latent_seed = derived_seed(cfg.seed, it, LATENT)  # one seed for the three: common deals
        latent = {
            "uniform": play_latent(space, {}, cfg.latent_games, latent_seed),
            "village_cfr": play_latent(space, {0: sigma}, cfg.latent_games, latent_seed),
            "werewolves_cfr": play_latent(space, {1: sigma}, cfg.latent_games, latent_seed),
        }
        pairs = preference_pairs(turns, space, table, cfg.min_gap, cfg.reject_invalid)
        summary: dict[str, Any] = {
            "iteration": it, **stats, "space": space.sizes(), "infosets": len(table.sums), "pairs": len(pairs),
            "latent_game_win": latent, "collect_s": t_collect, "cfr_s": t_cfr,
        }  # fmt: skip
        (folder / "space.json").write_text(json.dumps(space.to_dict(), indent=1))
        (folder / "space.pkl").write_bytes(pickle.dumps(space))  # (our own file: read back only on resume)
        if pairs:
            dcfg = DPOConfig(
                model=current if isinstance(current, str) else cfg.model, device=cfg.device, beta=cfg.beta, lr=cfg.lr,
                epochs=cfg.dpo_epochs, batch_size=cfg.batch_size, micro_batch_rows=4, output_dir=str(folder),
                tensorboard=False, progress=False, seed=derived_seed(cfg.seed, it, DPO) % 2**31,
            )  # fmt: skip
            given = (policy.model, policy.tokenizer) if not isinstance(current, str) else (None, None)
            dpo = train_dpo(dcfg, token_pairs(pairs, policy.renderer), *given)
            summary["dpo"] = {"first": dpo["first"], "last": dpo["last"], "steps": dpo["steps"]}
            current = str(folder / "model")
        summary["seconds"] = time.perf_counter() - t0
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        summaries.append(summary)
        print(json.dumps({k: v for k, v in summary.items() if k != "dpo"}, default=str))
    (out / "summary.json").write_text(
        json.dumps({"config": asdict(cfg), "iterations": summaries}, indent=2, default=str)
    )
    return summaries


# tokens a sequence may hold in the engine (prompt + reply), at most the model's positions
ENGINE_CAPACITY = 8192


def _policy(model: Any, tokenizer: Any, cfg: LSPOConfig) -> tuple[Any, Any, int | None]:
    """The proposer's policy (`cfg.engine`: our engine on CUDA, bf16), the HF policy over the same model (what
    DPO trains), and the longest prompt the proposer takes (None: no limit). The collection has the GPU to
    itself: half its free memory for the KV cache, given back before DPO."""
    from toolgym.agents.engine.select import choose_engine
    from toolgym.agents.hf import HFPolicy
    from toolgym.trainers.modeling import pick_device

    dev = pick_device(cfg.device)
    if isinstance(model, str):
        from toolgym.agents.hf import load_model

        model, tokenizer = load_model(model, device=str(dev), dtype="float32")
    hf = HFPolicy(model.to(dev), tokenizer, batch_size=256)
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None) or ENGINE_CAPACITY
    capacity = min(int(positions), ENGINE_CAPACITY)
    policy = choose_engine(
        hf, cfg.engine, rows=cfg.games * cfg.text_seats * cfg.candidates, capacity=capacity, quiet=True,
        memory=0.5, seed=cfg.seed,
    )  # fmt: skip
    return policy, hf, (None if policy is hf else capacity - cfg.max_new_tokens - 2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolgym.trainers.lspo.loop", description=__doc__.splitlines()[0]
    )
    for f in LSPOConfig.__dataclass_fields__.values():
        kind = type(f.default)
        if kind is bool:
            parser.add_argument(
                f"--{f.name.replace('_', '-')}",
                type=lambda s: s.lower() in ("1", "true", "yes"),
                default=f.default,
            )
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    args = parser.parse_args(argv)
    run(LSPOConfig(**vars(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
