"""Werewolf's learned-policy pipeline in one resumable command: SFT on the scripted players' games -> its win
rate -> LSPO iterations from the SFT model -> their win rate -> self-play GRPO from it -> its win rate.

    python benchmarks/werewolf.py --pipeline --runs DIR --seconds 495     # one call; a second call continues
    python benchmarks/werewolf.py --quick                                # the same on CPU, tiny sizes (smoke)

Units, in order (each one's output is its "done" mark, so a second call skips what the first finished):
``sft`` (DIR/sft: model/, summary.json), ``eval_sft`` (DIR/eval/sft/seed_N.json, one file a seed; all seeds
play as one batch), ``lspo`` (DIR/lspo/iter_N, one iteration a unit), ``eval_lspo``, ``selfplay`` (DIR/selfplay:
a GRPO run resumed from its checkpoint; the frozen seats play the SFT model, a folder, so the opponent is the
same after every resume), ``eval_selfplay``. The units that cannot stop midway come first; self-play, which
can, fills what the calls leave.

Time: ``--seconds`` is the call's budget, ``margin_s`` what is kept at its end. After every unit the list is
scanned again from the top and the first unit that can run and fits starts (a unit that does not fit is
skipped, a later one may): a unit that cannot stop midway when its estimate (the longest done unit of its
kind, else 1.25x the profile's; at least 1.5x what a cut run of it took) fits; a resumable one (self-play)
when its start and one step fit (the step: the longest of its last three in metrics.jsonl). Trainers get
``time_limit_s`` = what is left less the margin: they stop at the step boundary where the next step would not
end in time, save and raise ``Preempted`` (trainers/preemption.py). The profile plans the pipeline in
``calls`` calls: from the last one on, self-play's limit also keeps the estimates of the units that need it
(its evaluation), and when it stops for it (or cannot start) it is finished at its last checkpoint (done.json:
``capped``, the steps it got), so that its evaluation runs in the same call. A watchdog sends this process
SIGTERM a third of the margin before the end (a backstop), which a trainer turns into a checkpoint at the
next step boundary and every other unit into a stop that keeps its finished pieces; an outside SIGTERM
(``timeout``) does the same. Exit code 0 when every unit is done, 75 when a second call has work left, 1 when
a unit failed twice (its error is in pipeline.json).

Outputs, written after every unit: DIR/pipeline.json (units, durations, calls, errors) and, in the summary
folder (``--summary-dir``; default ``$OUT/werewolf`` when ``$OUT`` is set, else DIR/summary), a copy of every
small file (metrics.jsonl, summary.json, config.json, space.json, the per-seed evaluations; no weights) and the
results (``--out``: werewolf.{md,json} with the learned win rates merged into the scripted numbers). Each
self-play rollout's time split (``SelfPlayRollout.timing``: engine steps and seconds of the learner and the
frozen seats) goes to stderr, the job's log.

GPU (one H100/H200, SmolLM2-135M; the machine keeps DIR between calls while it stays warm, weights never
leave it: a fresh machine starts from sft): ``benchmarks/jobs/werewolf.txt`` through
``benchmarks/gpu_jobs.sh`` (its install and snapshot steps), calls back to back until it exits 0 (``python
benchmarks/werewolf.py --gpu-commands`` prints them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from machine import device_name

ENV = "toolgym/Werewolf-v0"
# the CPU smoke's model: the embedded model's tokenizer and chat template on a 2-layer random Llama (``make_tiny``)
TINY = "tiny-smollm2"
EXIT_MORE = 75  # EX_TEMPFAIL: run the same command again to continue
SMALL_FILES = (".json", ".jsonl", ".md", ".txt", ".yaml", ".png")
UNMEASURED = 1.25  # a unit whose kind has no measurement in this run: its profile estimate times this


@dataclass(frozen=True)
class Profile:
    """The sizes of every stage (``GPU``: the measurement; ``QUICK``: the CPU smoke)."""

    name: str
    model: str = "smollm2-135m"
    device: str = "auto"
    players: int = 7
    max_total_tokens: int = 4096
    max_turns: int = 40  # model turns per game in evaluation (a seat that never moves legally)
    # the call's end: trainers stop at their time limit this long before it (a step's overrun, a save, the
    # summaries); units start only when they fit before it; the watchdog fires a third of it before the end
    margin_s: float = 40.0
    calls: int = 3  # the calls the whole pipeline is planned in (from the last one on, self-play is capped)
    # 1. SFT on the strong scripted player's winning episodes (drawn seats, strong opponents)
    sft_episodes: int = 600
    sft_epochs: int = 2
    sft_batch: int = 16
    sft_lr: float = 5e-5
    sft_eval_episodes: int = 8  # (SFT's own end-of-run check; the win rate is eval_sft's)
    # 2. self-play GRPO from the SFT model: up to grpo_steps steps, fewer when the planned calls run out
    # (the unit is capped at its last checkpoint on the last call, so its evaluation still fits)
    grpo_steps: int = 24
    grpo_prompts: int = 8  # deals a step; x budget copies = 32 tables, x learner_seats = up to 64 rows
    grpo_budget: int = 4
    grpo_max_new_tokens: int = 48
    grpo_lr: float = 5e-6  # (1e-6 moved the weights ~1e-3 relative in 24 Adam steps: too little to show)
    grpo_save_every: int = 4  # (the time limit and SIGTERM save at the step boundary where they stop anyway)
    grpo_eval_every: int = 0  # the win-rate units evaluate; GRPO's own 32-episode check runs at its last step
    grpo_eval_episodes: int = 32
    grpo_compile: str = "off"  # the compiled update took ~70 s to warm up in every call for ~1 s a step saved
    learner_seats: int = 2
    frozen_seats: int = 1
    selfplay_max_turns: int = 16  # turns a seat gets before its game is abandoned (legal play needs <= ~10)
    micro_batch_rows: int = 8
    grpo_filter_zero_variance: bool = True  # (the smoke's 2 rollouts often tie: it trains on them anyway)
    # 3. LSPO from the SFT model
    lspo_iterations: int = 2
    lspo_games: int = 48
    lspo_text_seats: int = 3
    lspo_candidates: int = 4
    lspo_cfr_iterations: int = 10_000
    lspo_latent_games: int = 200
    lspo_max_new_tokens: int = 64
    lspo_dpo_epochs: int = 2
    lspo_batch: int = 16
    lspo_lr: float = 1e-6
    # 4. win rates against the strong scripted players: seeds x games held-out deals, greedy
    eval_seeds: int = 3
    eval_games: int = 200
    eval_max_new_tokens: int = 64
    # seconds a unit is expected to take before one was measured (a unit starts only when it fits);
    # selfplay_step: one GRPO step until the run's metrics.jsonl has some, selfplay_start: loading the
    # model and both engines before the first step (first steps carry their own warm-up)
    estimates: dict[str, float] = field(
        default_factory=lambda: {
            "sft": 160, "eval": 90, "lspo": 180, "selfplay_start": 45, "selfplay_step": 30,
        }
    )  # fmt: skip


GPU = Profile(name="gpu")
# The CPU smoke (2 loaded cores, SmolLM2-135M in fp32). Where the time goes (benchmarks/results/werewolf_quick.md
# has the measured split): every model turn re-reads a prompt of ~700-1000 tokens (the rules and five tool
# schemas), so prefill, not decoding, dominates; a model that makes no legal move repeats its turn, so turns
# are capped (max_turns 3); updates cost about 3x a forward of their tokens, so each stage trains on 2-4 rows.
QUICK = Profile(
    name="quick", model=TINY, device="cpu", players=5, max_total_tokens=2048, max_turns=4, margin_s=20.0,
    sft_episodes=2, sft_epochs=1, sft_batch=2, sft_eval_episodes=1,
    grpo_steps=1, grpo_prompts=1, grpo_budget=2, grpo_max_new_tokens=16, grpo_save_every=1, grpo_eval_every=0,
    grpo_eval_episodes=1, learner_seats=2, frozen_seats=0, micro_batch_rows=2, grpo_filter_zero_variance=False,
    lspo_iterations=1, lspo_games=1, lspo_text_seats=2, lspo_candidates=2, lspo_cfr_iterations=300,
    lspo_latent_games=20, lspo_max_new_tokens=16, lspo_dpo_epochs=1, lspo_batch=2, lspo_lr=1e-5,
    eval_seeds=2, eval_games=1, eval_max_new_tokens=16,
    selfplay_max_turns=4, calls=1, grpo_compile="auto",
    estimates={"sft": 60, "eval": 40, "lspo": 90, "selfplay_start": 20, "selfplay_step": 30},
)  # fmt: skip


class TimeUp(BaseException):  # (not Exception: a library's broad `except Exception` must not swallow it)
    """The call's budget ran out (the watchdog's or an outside SIGTERM) while a unit ran."""


@dataclass
class Unit:
    name: str
    kind: str  # sft | eval | selfplay | lspo (the estimate's key)
    done: Callable[[], bool]
    run: Callable[[], None]
    needs: tuple[str, ...] = ()
    # resumable: a trainer with a checkpoint and a time limit (it starts when its start and one step fit,
    # and stops at a step boundary before the call ends); cap: on the last planned call it is finished at
    # its last checkpoint (``Pipeline.cap``) so that what needs it still runs
    resumable: bool = False
    cap: Callable[[], bool] | None = None
    checkpointed: bool = False  # a cut run continues from its checkpoint (SFT: scheduled whole all the same)


class Pipeline:
    """The units of one pipeline over a run folder (module docstring)."""

    def __init__(
        self,
        profile: Profile,
        runs: str | Path,
        seconds: float,
        summary_dir: str | Path | None = None,
        out: str | None = None,
        seed: int = 0,
        baseline: str | None = "benchmarks/results/werewolf",
    ) -> None:
        self.p = profile
        self.runs = Path(runs).resolve()
        self.seconds = seconds
        self.summary = Path(summary_dir) if summary_dir else self.runs / "summary"
        self.out = out or str(self.summary / "werewolf")
        self.seed = seed
        self.baseline = baseline  # the scripted numbers the learned ones are merged into (None: a fresh file)
        self.state_path = self.runs / "pipeline.json"
        self.model = profile.model  # TINY becomes a folder in the run (run())
        self.state: dict[str, Any] = {"units": {}, "calls": []}
        self._finishing = False
        self.time_limit: float | None = None  # the running unit's: seconds it may take (``run``)

    # ----- paths and done marks ----------------------------------------------------------------------------
    def sft_model(self) -> Path:
        return self.runs / "sft" / "model"

    def lspo_model(self) -> Path:
        """The last LSPO iteration's model (an iteration without pairs trains nothing: the one before, else
        the SFT model)."""
        for it in range(self.p.lspo_iterations, 0, -1):
            folder = self.runs / "lspo" / f"iter_{it}" / "model"
            if (folder / "config.json").is_file():
                return folder
        return self.sft_model()

    def lspo_done(self) -> int:
        return sum(
            (self.runs / "lspo" / f"iter_{it}" / "summary.json").is_file()
            for it in range(1, self.p.lspo_iterations + 1)
        )

    def lspo_reached(self, iteration: int) -> bool:
        return self.lspo_done() >= iteration

    def eval_dir(self, name: str) -> Path:
        return self.runs / "eval" / name

    def eval_done(self, name: str) -> bool:
        return all((self.eval_dir(name) / f"seed_{s}.json").is_file() for s in range(self.p.eval_seeds))

    def units(self) -> list[Unit]:
        def sft_done() -> bool:
            return (self.sft_model() / "config.json").is_file() and (
                self.runs / "sft" / "summary.json"
            ).is_file()

        # the units that cannot stop in the middle first, self-play (which can) last: it fills what the
        # calls leave, and on the last planned call stops in time for its own evaluation
        return [
            Unit("sft", "sft", sft_done, self.run_sft, checkpointed=True),
            Unit("eval_sft", "eval", lambda: self.eval_done("sft"), lambda: self.run_eval("sft"), ("sft",)),
            *(
                Unit(f"lspo_{it}", "lspo", functools.partial(self.lspo_reached, it), functools.partial(self.run_lspo, it),
                     ("sft",) if it == 1 else (f"lspo_{it - 1}",))
                for it in range(1, self.p.lspo_iterations + 1)
            ),
            Unit("eval_lspo", "eval", lambda: self.eval_done("lspo"), lambda: self.run_eval("lspo"),
                 (f"lspo_{self.p.lspo_iterations}",)),
            Unit("selfplay", "selfplay", (self.runs / "selfplay" / "done.json").is_file, self.run_selfplay, ("sft",),
                 resumable=True, cap=self.cap_selfplay),
            Unit("eval_selfplay", "eval", lambda: self.eval_done("selfplay"), lambda: self.run_eval("selfplay"),
                 ("selfplay",)),
        ]  # fmt: skip

    # ----- the stages ---------------------------------------------------------------------------------------
    def play_kwargs(self) -> dict[str, Any]:
        """The seat env of self-play and evaluation: strong scripted opponents, text prompts, capped turns."""
        return {"n_players": self.p.players, "opponents": "strong", "prompt_format": "text",
                "max_turns": self.p.max_turns}  # fmt: skip

    def sft_config(self) -> Any:
        from toolgym.trainers.sft import SFTConfig

        folder = self.runs / "sft"
        # save_every/resume: an SFT that checkpoints continues a cut run (one that does not ignores them)
        extra = {"save_every": 10, "resume": "auto", "time_limit_s": self.time_limit}
        extra = {k: v for k, v in extra.items() if k in {f.name for f in dataclasses.fields(SFTConfig)}}
        return SFTConfig(
            env_ids=[ENV], env_kwargs={"n_players": self.p.players, "opponents": "strong", "prompt_format": "text"},
            model=self.model, device=self.p.device, seed=self.seed, episodes=self.p.sft_episodes,
            epochs=self.p.sft_epochs, batch_size=self.p.sft_batch, lr=self.p.sft_lr,
            max_total_tokens=self.p.max_total_tokens, max_new_tokens=self.p.eval_max_new_tokens,
            eval_env_kwargs={"max_turns": self.p.max_turns}, eval_before=False,
            eval_episodes=self.p.sft_eval_episodes, output_dir=str(folder), tensorboard=False, progress=False,
            **extra,
        )  # fmt: skip

    def run_sft(self) -> None:
        from toolgym.trainers.sft import train

        train(self.sft_config())

    def grpo_config(self) -> Any:
        from toolgym.trainers.grpo_config import GRPOConfig

        folder = self.runs / "selfplay"
        # the call's time limit, where the trainer has one (else the watchdog's SIGTERM stops it)
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        extra = {"time_limit_s": self.time_limit} if "time_limit_s" in names else {}
        return GRPOConfig(
            env_ids=[ENV], env_kwargs=self.play_kwargs(), model=str(self.sft_model()), device=self.p.device,
            seed=self.seed, steps=self.p.grpo_steps, prompts_per_step=self.p.grpo_prompts,
            budget=self.p.grpo_budget, max_new_tokens=self.p.grpo_max_new_tokens,
            max_total_tokens=self.p.max_total_tokens, lr=self.p.grpo_lr, save_every=self.p.grpo_save_every,
            eval_every=self.p.grpo_eval_every, eval_episodes=self.p.grpo_eval_episodes,
            micro_batch_rows=self.p.micro_batch_rows, filter_zero_variance=self.p.grpo_filter_zero_variance,
            output_dir=str(folder), tensorboard=False, progress=False, compile=self.p.grpo_compile,
            resume="auto",  # a cut run continues from its checkpoint in output_dir, if it has one
            selfplay={
                "learner_seats": self.p.learner_seats, "frozen_seats": self.p.frozen_seats,
                "snapshot": str(self.sft_model()), "others": "strong",
                "max_turns_per_seat": self.p.selfplay_max_turns,
            },
            **extra,
        )  # fmt: skip

    def run_selfplay(self) -> None:
        from toolgym.trainers import grpo

        folder = self.runs / "selfplay"
        before = os.environ.get("TOOLGYM_SELFPLAY_TIMING")
        os.environ["TOOLGYM_SELFPLAY_TIMING"] = "1"  # each rollout's split on stderr (the job's log)
        try:
            metrics = grpo.train(self.grpo_config())
        finally:
            if before is None:
                del os.environ["TOOLGYM_SELFPLAY_TIMING"]
            else:
                os.environ["TOOLGYM_SELFPLAY_TIMING"] = before
        (folder / "done.json").write_text(
            json.dumps({"steps": self.p.grpo_steps, "last": metrics}, default=str)
        )

    def selfplay_steps(self) -> list[tuple[int, float]]:
        """(step, seconds) of every self-play step in its metrics.jsonl (a resumed run appends)."""
        path = self.runs / "selfplay" / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return [(int(r["step"]), float(r["time/step_s"])) for r in rows if "time/step_s" in r]

    def cap_selfplay(self) -> bool:
        """Finishes self-play at its last checkpoint (fewer than grpo_steps steps: the planned calls ran out);
        False when there is none yet. done.json says how many steps it got."""
        from toolgym.trainers import checkpoint

        folder = checkpoint.complete(self.runs / "selfplay" / "checkpoint")
        step = checkpoint.saved_step(folder) if (folder / "model.pt").is_file() else None
        if not step:
            return False
        (self.runs / "selfplay" / "done.json").write_text(
            json.dumps({"steps": step, "capped": True, "planned_steps": self.p.grpo_steps})
        )
        return True

    def lspo_config(self, iteration: int) -> Any:
        from toolgym.trainers.lspo.loop import LSPOConfig

        p = self.p
        return LSPOConfig(
            model=str(self.sft_model()), iterations=iteration, games=p.lspo_games, text_seats=p.lspo_text_seats,
            candidates=p.lspo_candidates, n_players=p.players, cfr_iterations=p.lspo_cfr_iterations,
            latent_games=p.lspo_latent_games, beta=0.1, lr=p.lspo_lr, dpo_epochs=p.lspo_dpo_epochs,
            batch_size=p.lspo_batch, max_new_tokens=p.lspo_max_new_tokens, max_turns_per_seat=p.max_turns,
            device=p.device, seed=self.seed, out=str(self.runs / "lspo"),
        )  # fmt: skip

    def run_lspo(self, iteration: int) -> None:
        from toolgym.trainers.lspo.loop import run

        run(self.lspo_config(iteration))

    def stage_path(self, name: str) -> Path:
        return {"sft": self.sft_model(), "selfplay": self.runs / "selfplay", "lspo": self.lspo_model()}[name]

    def run_eval(self, name: str) -> None:
        from werewolf import learned_win_rates

        learned_win_rates(
            name, str(self.stage_path(name)), self.p.eval_seeds, self.p.eval_games, self.p.players,
            self.p.eval_max_new_tokens, self.p.device, max_turns=self.p.max_turns,
            max_total_tokens=self.p.max_total_tokens, cache=self.eval_dir(name),
        )  # fmt: skip

    # ----- the call -----------------------------------------------------------------------------------------
    def estimate(self, unit: Unit) -> float:
        """Seconds the unit takes to its end: the longest done unit of its kind, else 1.25x the profile's; a
        unit cut for time counts at least 1.5x what it ran then (it is not started again in a call it cannot
        end)."""
        measured = [
            u["seconds"]
            for n, u in self.state["units"].items()
            if u.get("kind") == unit.kind and u.get("done") and not u.get("capped")
        ]
        # a kind not measured in this run yet (its first unit) counts UNMEASURED x the profile's guess
        est = max(measured) if measured else UNMEASURED * float(self.p.estimates.get(unit.kind, 60))
        if unit.resumable:
            left = max(0, self.p.grpo_steps - max((st for st, _ in self.selfplay_steps()), default=0))
            return self.p.estimates.get(f"{unit.kind}_start", 30.0) + left * self.step_estimate()
        if unit.checkpointed:
            return est
        return max(est, 1.5 * float(self.state["units"].get(unit.name, {}).get("seconds_partial", 0.0)))

    def step_estimate(self) -> float:
        """One self-play step: the longest of the last three measured (a call's first carries the warm-up)."""
        steps = [t for _, t in self.selfplay_steps()][-3:]
        return max(steps) if steps else float(self.p.estimates.get("selfplay_step", 60.0))

    def start_need(self, unit: Unit) -> float:
        """Seconds a unit needs to be worth starting: all of it, or a resumable one's start and one step."""
        if unit.resumable:
            return self.p.estimates.get(f"{unit.kind}_start", 30.0) + self.step_estimate()
        return self.estimate(unit)

    def reserve(self, unit: Unit) -> float:
        """On the last planned call: the seconds the units that need ``unit`` (its evaluation) take after it."""
        units = {u.name: u for u in self.units()}

        def after(u: Unit) -> bool:
            return any(n == unit.name or after(units[n]) for n in u.needs)

        return sum(self.estimate(u) for u in units.values() if after(u) and not u.done())

    def run(self, max_units: int | None = None) -> int:
        """One call: the units that fit, then the summaries. Returns the exit code (module docstring)."""
        t0 = time.monotonic()
        deadline = t0 + self.seconds
        self.runs.mkdir(parents=True, exist_ok=True)
        if self.state_path.is_file():
            self.state = json.loads(self.state_path.read_text())
        self.state["profile"] = asdict(self.p)
        if self.p.model == TINY:
            self.model = str(make_tiny(self.runs / "tiny_model", seed=self.seed))
        call: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),  # UTC, as results are dated
            "device": device_name(),
            "seconds_budget": self.seconds,
            "ran": [],
        }
        self.state["calls"].append(call)
        last = len(self.state["calls"]) >= self.p.calls  # from the last planned call on, self-play is capped
        skipped: dict[str, str] = {}  # unit -> why it did not start (its first reason this call)
        tried: set[str] = set()
        ran = 0
        with self._watchdog(max(1.0, self.seconds - self.p.margin_s / 3)):
            try:
                stop = False
                again = True
                while again and not stop:  # after each unit, from the top: what it ends may unblock others
                    again = False
                    for unit in self.units():
                        rec = self.state["units"].setdefault(unit.name, {"kind": unit.kind, "failures": 0})
                        if unit.done():
                            rec["done"] = True
                            continue
                        if (
                            unit.name in tried  # once a call (a unit that returned without its mark)
                            or rec.get("failures", 0) >= 2
                            or any(not self.state["units"].get(n, {}).get("done") for n in unit.needs)
                        ):
                            continue
                        if max_units is not None and ran >= max_units:
                            call["stopped"], stop = "max_units", True
                            break
                        left = deadline - time.monotonic()
                        keep = self.reserve(unit) if last and unit.cap is not None else 0.0
                        need = self.start_need(unit)
                        if need > left - self.p.margin_s - keep:
                            if last and unit.cap is not None and unit.cap():  # ends at its last checkpoint
                                rec["done"], rec["capped"], again = True, True, True
                                self.save()
                                break
                            skipped.setdefault(
                                unit.name,
                                f"{unit.name}: estimate {need:.0f} s > {left:.0f} s left"
                                + (f" ({keep:.0f} s kept for the units after it)" if keep else ""),
                            )
                            continue  # a later unit may fit
                        # the trainers' time limit: seconds from the start of their train()
                        self.time_limit = max(1.0, left - self.p.margin_s - keep)
                        tried.add(unit.name)
                        stopped = self._timed(unit, rec, call)
                        ran += 1
                        if stopped == "limit" and last and unit.cap is not None and unit.cap():
                            rec["done"], rec["capped"] = True, True
                        self.save()
                        if stopped == "time":
                            call["stopped"], stop = f"{unit.name}: budget", True
                        again = True
                        break
            except TimeUp:  # the signal came between units (while saving): what is saved stays
                call["stopped"] = "budget, between units"
            if skipped:
                call["skipped"] = list(skipped.values())
                call.setdefault("stopped", call["skipped"][0])
            self._finishing = True  # a later signal (the outer timeout) no longer interrupts the summaries
            call["seconds"] = time.monotonic() - t0
            left_units = [u.name for u in self.units() if not u.done()]
            failed = [n for n in left_units if self.state["units"].get(n, {}).get("failures", 0) >= 2]
            self.state["left"] = left_units
            self.save()
        print(json.dumps({"left": left_units, "failed": failed, "call": call}, default=str), flush=True)
        if not left_units:
            return 0
        blocked = all(n in failed or self._blocked(n, failed) for n in left_units)
        return 1 if failed and blocked else EXIT_MORE

    def _timed(self, unit: Unit, rec: dict[str, Any], call: dict[str, Any]) -> str | None:
        """Runs a unit and books its time (a unit cut short keeps its partial time for the next estimate)."""
        t = time.monotonic()
        stopped = self._run_unit(unit, rec)
        rec["seconds"] = rec.get("seconds_partial", 0.0) + time.monotonic() - t
        call["ran"].append({"unit": unit.name, "seconds": time.monotonic() - t, "stopped": stopped})
        if unit.done():
            rec["done"] = True
            rec.pop("seconds_partial", None)
        else:
            rec["seconds_partial"] = rec["seconds"]
        return stopped

    def _blocked(self, name: str, failed: list[str]) -> bool:
        units = {u.name: u for u in self.units()}
        return any(n in failed or self._blocked(n, failed) for n in units[name].needs)

    def _run_unit(self, unit: Unit, rec: dict[str, Any]) -> str | None:
        """Runs one unit; None when it returned, "time" when the budget stopped it, "error" when it failed."""
        from toolgym.trainers.preemption import EXIT_SIGINT, EXIT_SIGTERM, Preempted

        print(f"[werewolf pipeline] {unit.name} ...", flush=True)
        try:
            unit.run()
            return None
        except (TimeUp, Preempted) as exc:
            print(f"[werewolf pipeline] {unit.name}: stopped for time ({exc})", flush=True)
            # a trainer's own time limit (signum None) left the call's end to the units after it
            return "limit" if isinstance(exc, Preempted) and exc.signum is None else "time"
        except (
            SystemExit
        ) as exc:  # a trainer's second signal (trainers/preemption.py): stop at once, but here
            if exc.code not in (EXIT_SIGTERM, EXIT_SIGINT):
                raise
            print(f"[werewolf pipeline] {unit.name}: stopped by a second signal", flush=True)
            return "time"
        except Exception as exc:  # a unit's failure is recorded; the units that do not need it still run
            rec["failures"] = rec.get("failures", 0) + 1
            rec["error"] = "".join(traceback.format_exception(exc))[-3000:]
            print(f"[werewolf pipeline] {unit.name} failed: {exc!r}", flush=True)
            return "error"
        finally:
            from toolgym.trainers.gpu_memory import free_gpu_memory

            free_gpu_memory()  # the unit's models and engines go before the next unit's

    @contextmanager
    def _watchdog(self, after_s: float) -> Iterator[None]:
        """SIGTERM to this process after ``after_s`` seconds; SIGTERM while a unit runs raises TimeUp (GRPO and
        SFT install their own handler meanwhile: a checkpoint, then Preempted)."""

        def handle(signum: int, frame: Any) -> None:
            if not self._finishing:
                raise TimeUp(f"signal {signum}")

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, handle) if main else None
        timer = threading.Timer(after_s, lambda: os.kill(os.getpid(), signal.SIGTERM))
        timer.daemon = True
        if main:
            timer.start()
        try:
            yield
        finally:
            timer.cancel()
            self._finishing = True
            if main:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    # ----- outputs ------------------------------------------------------------------------------------------
    def save(self) -> None:
        """pipeline.json, the summary folder's copies and the results: after every unit (a cut call keeps them)."""
        self.state_path.write_text(json.dumps(self.state, indent=2, default=str))
        self.export()
        self.write_results()

    def export(self) -> None:
        self.summary.mkdir(parents=True, exist_ok=True)
        for path in self.runs.rglob("*"):
            rel = path.relative_to(self.runs)
            if (
                not path.is_file() or path.suffix not in SMALL_FILES or rel.parts[0] == "summary"
                or any(p in ("model", "tiny_model", "checkpoint", "checkpoint.tmp", "tensorboard") for p in rel.parts)
                or path.stat().st_size > 5_000_000 or self.summary.resolve() in path.resolve().parents
            ):  # fmt: skip
                continue
            target = self.summary / "runs" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)

    def write_results(self) -> None:
        from werewolf import merge_seed_files, paired_gain, write_learned

        found: dict[str, Any] = {}
        for name in ("sft", "selfplay", "lspo"):
            if self.eval_done(name):
                found |= merge_seed_files(name, self.eval_dir(name), self.p.eval_seeds)
                if name != "sft" and self.eval_done("sft"):
                    found |= paired_gain(name, self.eval_dir(name), self.eval_dir("sft"), self.p.eval_seeds)
        jpath = Path(f"{self.out}.json")
        jpath.parent.mkdir(parents=True, exist_ok=True)
        if self.baseline and not jpath.is_file():
            for suffix in (".json", ".md"):
                if Path(self.baseline + suffix).is_file():
                    shutil.copyfile(self.baseline + suffix, f"{self.out}{suffix}")
        found["pipeline"] = self.pipeline_record()
        write_learned(self.out, found, head=self.head(), quiet=True)
        shutil.copyfile(self.state_path, self.summary / "pipeline.json")

    def pipeline_record(self) -> dict[str, Any]:
        units = self.state["units"]
        return {
            "profile": self.p.name, "model": self.p.model, "seed": self.seed, "runs": str(self.runs),
            "units": {n: {"done": bool(u.get("done")), "seconds": round(float(u.get("seconds", 0.0)), 1),
                          **({"error": u["error"].splitlines()[-1]} if u.get("error") else {})}
                      for n, u in units.items()},
            "calls": [{"seconds": round(float(c.get("seconds", 0.0)), 1), "stopped": c.get("stopped"),
                       "started": c.get("started"), "device": c.get("device")}
                      for c in self.state["calls"]],
            "breakdown": self.breakdown(),
        }  # fmt: skip

    def breakdown(self) -> dict[str, Any]:
        """Where each stage's time went, read off its own summaries."""
        out: dict[str, Any] = {}
        sft = self.runs / "sft" / "summary.json"
        if sft.is_file():
            s = json.loads(sft.read_text())
            out["sft"] = {k: s.get(k) for k in ("conversations", "steps", "trained_tokens", "seconds")}
        metrics = self.runs / "selfplay" / "metrics.jsonl"
        if metrics.is_file():
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
            keys = ("time/step_s", "rollout/generate_s", "rollout/env_s", "rollout/generated_tokens",
                    "rollout/episodes", "losses/updates", "eval/success")  # fmt: skip
            out["selfplay"] = [
                {k: r[k] for k in ("step", *keys) if k in r} for r in rows if "time/step_s" in r
            ]
        for it in range(1, self.p.lspo_iterations + 1):
            f = self.runs / "lspo" / f"iter_{it}" / "summary.json"
            if f.is_file():
                s = json.loads(f.read_text())
                out[f"lspo_{it}"] = {
                    k: s.get(k)
                    for k in ("games", "discussion_turns", "pairs", "collect_s", "cfr_s", "seconds")
                }
        for name in ("sft", "selfplay", "lspo"):
            seeds = sorted(self.eval_dir(name).glob("seed_*.json"))
            if seeds:
                out[f"eval_{name}"] = [json.loads(f.read_text()).get("seconds") for f in seeds]
        return out  # fmt: skip

    def head(self) -> str | None:
        """The results file's heading for the CPU smoke (None: keep the file's own)."""
        if self.p.name == "gpu":
            return None
        return (
            f"# Werewolf pipeline: CPU smoke ({self.p.name} profile), NOT a result\n\n"
            "`python benchmarks/werewolf.py --quick`: every stage of the GPU pipeline (SFT -> self-play GRPO -> "
            "LSPO -> win rates with intervals) at toy sizes on CPU, to prove the path end to end. The win rates "
            "below come from a few short games of a barely trained model: they measure nothing. The GPU "
            "measurement is `python benchmarks/werewolf.py --gpu-commands` (results in werewolf.md)."
        )


def make_tiny(folder: Path, base: str = "smollm2-135m", seed: int = 0) -> Path:
    """A 2-layer, 64-wide random Llama with ``base``'s tokenizer, chat template and vocabulary, saved in
    ``folder`` (kept: a second call reuses it). The prompts, tokens and templates are the real ones; the
    compute is a few hundredths of the 135M model's, whose CPU step took minutes on the shared machine."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.embedded import resolve_model

    path = resolve_model(base)
    cfg = AutoConfig.from_pretrained(path)
    for key, value in {
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16,
    }.items():  # fmt: skip
        setattr(cfg, key, value)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # (a GGUF load flags the config: the trainers refuse quantized models)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp)
    for extra in ("chat_template.jinja", "additional_chat_templates"):  # the tool-use template travels too
        src = Path(path) / extra
        if src.is_dir() and not (tmp / extra).exists():
            shutil.copytree(src, tmp / extra)
        elif src.is_file() and not (tmp / extra).exists():
            shutil.copyfile(src, tmp / extra)
    tmp.rename(folder)
    return folder


def default_summary_dir(runs: Path) -> Path:
    env = os.environ.get("OUT")
    return Path(env) / "werewolf" if env else runs / "summary"
