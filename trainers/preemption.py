"""Preemption: a run that gets SIGTERM (SLURM, Kubernetes, torchrun's shutdown), SIGUSR1 (SLURM's
``--signal=USR1@300``, Lightning's convention for "requeue soon") or SIGINT (Ctrl-C) stops at the next step
boundary with a checkpoint of its last completed step, in the format `resume` reads (``resume: auto`` runs
the same command again: it continues when the checkpoint is there, else starts fresh).

The first signal only sets a flag; the loop calls `Preemption.check` at the top of every step. There all
ranks sum their flags (one all_reduce of one number under torchrun: a clock counts 1, a signal world + 1),
so a rank that alone got the signal stops the others at the same step and every rank takes part in the save (a sharded DCP save needs all of
them; a rank that stopped alone would leave the others blocked in the next collective). Rank 0 (every rank
under fsdp2) writes the checkpoint unless the one on disk already holds that step, the ranks meet at a
barrier (so torchrun does not tear rank 0 down mid-save), rank 0 prints
``preempted at step N: checkpoint in DIR; resume with …`` and `Preempted` is raised; the commands turn it
into exit code 128 + the signal's number (`EXIT_SIGTERM` 143, `EXIT_SIGUSR1` 138, `EXIT_SIGINT` 130).
SIGUSR1 is handled as SIGTERM; torchrun itself does not catch it (its default action ends the launcher),
so under torchrun signal SIGTERM, or trap USR1 in the batch script and send TERM on (docs/trainer.md).

A second Ctrl-C (SIGINT) ends the process at once with code 130 (``os._exit``: no cleanup, so envs are not
closed; `toolgym sandbox doctor --prune` removes sandbox containers left behind); in a Jupyter kernel it
raises KeyboardInterrupt instead. A SIGINT within `REPEAT_S` of the first is its copy (the terminal signals
the whole process group, torchrun forwards it too). Repeated SIGTERM or SIGUSR1 never escalate: they come
from machines, not from a person in a hurry (``timeout`` signals its whole process group, torchrun forwards
what SLURM already sent, a watchdog and the scheduler each send their own), and the sender's SIGKILL is the
hard stop; counting a second one as "stop now" lost the save it was waiting for. The checkpoint folder
keeps its last complete save: saves are written aside and renamed, and `checkpoint.load` reads the
previous one when a stop fell between the two renames.

A time limit (``time_limit_s``, ``--time-limit-s 1:55:00``: seconds or SLURM's [D-]HH:MM[:SS]) stops the run
the same way, before the budget runs out rather than after a signal: at each step boundary the next step is
estimated as `SAFETY` times the longest of the last `WINDOW` step cycles (evaluations and periodic saves
included; a step with an evaluation or a save due, `heavy`, at least as long as the last such one), and when
that would end past the limit the run saves, prints ``time limit: stopped at step N …`` and exits `EXIT_TIME_LIMIT` (75, "try again": resume continues). The
first step of each process always runs (a requeued job makes progress every call). The clock starts when
the trainer starts (model loading before it not counted).

Every stop writes ``output_dir/preempted.json`` (`note`; the next run removes it at its first step boundary):
under torchrun the launcher exits 1 whatever its ranks exit with, so a requeue script reads the note. Under
torchrun each rank ends with the stop's code: a stopped rank ignores the SIGTERM torchrun sends the ranks
still running once the first one exits, and the command ends it with ``os._exit`` after the save
(`exit_status`: the teardown, with threads blocked in collectives whose peers are gone, aborted). The split
layout's rollout ranks never check: learner 0 writes its stop into torchrun's store (`announce`) and a rollout
rank raises it (`announced`) when its connection to the learners breaks or a signal comes after it.

The step in progress when the signal arrives is finished, not abandoned: its rollouts and update run to
the end, so the stop takes up to a step plus a save (give SLURM that much: ``#SBATCH --signal=TERM@120``
and ``KillWait``; torchrun kills its workers 30 s after forwarding a signal).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from toolgym.errors import ToolgymError

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a process SIGTERM stopped
EXIT_SIGUSR1 = 128 + signal.SIGUSR1  # 138 (SLURM --signal=USR1@N: stop and save before the time limit)
EXIT_SIGINT = 128 + signal.SIGINT  # 130
RESUME_WORDS = ("auto", "true", "false")  # what may follow --resume on a command line
EXIT_TIME_LIMIT = 75  # EX_TEMPFAIL: stopped for its time limit with work left; the same command resumes
REPEAT_S = 1.0  # a SIGINT again within this many seconds is a copy of the first (torchrun forwards it)
WINDOW = 3  # step cycles the time limit's estimate of the next step looks at
SAFETY = 1.25  # the next step is estimated at this times the longest recent cycle (steps vary)
# a process still running this long after its first signal writes every thread's stack to stderr: a step that
# never ends (a deadlock: two H200s, 2026-11-28) then says where it waits before the SIGKILL comes
STACKS_AFTER_S = 20.0
STOP_FILE = "preempted.json"  # in output_dir after a stop: {"step", "exit_code", "signal", "reason"} (`note`)


class Preempted(ToolgymError):
    """The run stopped on a signal (or its time limit: `signum` None) after saving the checkpoint of `step` in
    `folder`; `exit_code` is 128 + the signal's number (143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT), or
    `EXIT_TIME_LIMIT` (75)."""

    def __init__(self, step: int, folder: Path, signum: int | None, why: str = "") -> None:
        self.step, self.folder, self.signum, self.why = step, folder, signum, why
        self.exit_code = EXIT_TIME_LIMIT if signum is None else 128 + signum
        head = (
            f"time limit: stopped at step {step} ({why})"
            if signum is None
            else f"preempted at step {step} ({signal.Signals(signum).name})"
        )
        super().__init__(f"{head}: checkpoint in {folder}; resume with {resume_command()}")


def resume_command() -> str:
    """This process's command with ``--resume`` when it is the ``toolgym`` command; else what to set.

    >>> import sys; argv, sys.argv = sys.argv, ["toolgym", "train", "--config", "my run.yaml", "--no-resume"]
    >>> resume_command()
    "toolgym train --config 'my run.yaml' --resume"
    >>> sys.argv = ["toolgym", "sft", "--resume", "auto", "--steps", "9"]; resume_command()
    'toolgym sft --steps 9 --resume'
    >>> sys.argv = argv
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    via_module = spec is not None and spec.name == "toolgym.__main__"
    if not (via_module or Path(sys.argv[0]).name == "toolgym") or len(sys.argv) < 2:
        return "the same command and --resume (resume: true in the config)"
    args = shlex.join(_without_resume(sys.argv[1:]))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: its own options are not in our argv
        return f"torchrun ... -m toolgym {args} --resume"
    return f"toolgym {args} --resume"


def _without_resume(argv: list[str]) -> list[str]:
    """`argv` without its resume flags: ``--resume [auto|true|false]``, ``--resume=X``, ``--no-resume``."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--resume":
            skip = i + 1 < len(argv) and argv[i + 1] in RESUME_WORDS
            continue
        if a == "--no-resume" or a.startswith("--resume="):
            continue
        out.append(a)
    return out


def _say(line: str) -> None:
    """One line to stderr from a signal handler: straight to the file descriptor (a `print` there can land
    inside the interrupted code's own write to sys.stderr, and Python refuses that reentrant call)."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _stacks(name: str) -> None:
    _say(f"toolgym: still running {STACKS_AFTER_S:.0f} s after {name}; where each thread is:")
    with contextlib.suppress(OSError, ValueError):
        faulthandler.dump_traceback(file=2, all_threads=True)


class Preemption:
    """SIGTERM/SIGUSR1/SIGINT handlers for the length of a run (a context manager; a no-op off the main thread,
    where Python cannot install handlers). `saved(step)` says whether the loop has already written the
    checkpoint of `step` (its `save_every` schedule); the first `check` is at the run's first step, where
    a resumed run's checkpoint is the one on disk."""

    def __init__(
        self,
        resumed: bool,
        saved: Callable[[int], bool],
        doing: str = "finishing this step, then saving a checkpoint",
        time_limit_s: float | None = None,
        follow: bool = False,
        heavy: Callable[[int], bool] | None = None,
    ) -> None:
        self.resumed = resumed
        # a process that never checks (the split layout's rollout ranks): a signal once the learners have
        # announced their stop raises it, so this process ends with their code (torchrun's SIGTERM comes then)
        self.follow = follow
        self.saved = saved
        self.doing = doing  # what the first signal's line says the process does now
        self.signum: int | None = None
        self._at = 0.0  # when the first signal came (time.monotonic)
        self._previous: dict[int, Any] = {}
        self._checked = False
        self.time_limit_s = time_limit_s
        self._start = time.monotonic()
        self._last_check: float | None = None
        self._cycles: list[float] = []  # the last WINDOW step cycles, seconds
        # whether step s ends with periodic work (an evaluation, a save): such a step is estimated by the last
        # one like it too, not only by the last WINDOW (with eval_every > WINDOW they hold no evaluation)
        self.heavy = heavy or (lambda s: False)
        self._heavy_cycle = 0.0
        self.out_of_time = ""  # why the time limit stops the run (empty: it does not)
        self._stacks: threading.Timer | None = None

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Preempted) and under_torchrun():
            # Saved and leaving: torchrun SIGTERMs the ranks still running once the first one exits, and a
            # rank still closing its envs would then end with -15 instead of the stop's code (every rank must
            # report the same). A later signal is ignored; torchrun's SIGKILL 30 s on is still the hard stop.
            for s in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(s, signal.SIG_IGN)
            self._previous = {s: h for s, h in self._previous.items() if s == signal.SIGINT}
        self._restore()

    def _restore(self) -> None:
        if self._stacks is not None:  # (ended, not only told to: a run leaves no thread of its own behind)
            self._stacks.cancel()
            if self._stacks is not threading.current_thread():
                self._stacks.join(timeout=5)
            self._stacks = None
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        name = signal.Signals(signum).name
        if self.follow and (stop := announced()) is not None:
            raise stop  # (in the main thread, at its next bytecode: a wait on a lock or condition is left)
        if self.signum is None:
            self.signum, self._at = signum, now
            again = (
                "Ctrl-C again to stop at once, without it"
                if signum == signal.SIGINT
                else "SIGKILL stops at once"
            )
            _say(f"toolgym: got {name}: {self.doing} ({again})")
            self._stacks = threading.Timer(STACKS_AFTER_S, _stacks, args=(name,))
            self._stacks.daemon = True
            self._stacks.start()
            return
        if signum != signal.SIGINT or (self.signum == signal.SIGINT and now - self._at < REPEAT_S):
            return  # a machine's repeat (timeout's group signal, torchrun's forward), or Ctrl-C's copy
        _say(f"toolgym: got {name} again: stopping now, without a checkpoint of this step")
        if signum == signal.SIGINT and "ipykernel" in sys.modules:
            self._restore()
            raise KeyboardInterrupt  # a notebook's second interrupt: stop the cell, keep the kernel
        # at once: no unwinding (the episode loop would wait for its env calls, the rollout worker for its batch)
        os._exit(128 + signum)

    def _time_up(self, step: int) -> str:
        """Why the next step (`step` + 1) would end past the time limit ("" when it would not, or there is
        none). Called once per step boundary: it books the cycle since the last call (that of `step`)."""
        now = time.monotonic()
        if self._last_check is not None:
            cycle = now - self._last_check
            self._cycles = [*self._cycles, cycle][-WINDOW:]
            if self.heavy(step):
                self._heavy_cycle = cycle
        self._last_check = now
        if self.time_limit_s is None or not self._cycles:
            return ""  # the first step always runs: every call of a requeued job makes progress
        elapsed = now - self._start
        nxt = SAFETY * max([*self._cycles, self._heavy_cycle if self.heavy(step + 1) else 0.0])
        if elapsed + nxt > self.time_limit_s:
            return f"{elapsed:.0f} s gone of {self.time_limit_s:.0f} s; the next step would take ~{nxt:.0f} s"
        return ""

    def requested(self, dist: Any = None, step: int = 0) -> bool:
        """Whether any rank got a signal or ran out of time (every rank must call it at the same point, once
        a step boundary, `step` steps done: one all_reduce)."""
        self.out_of_time = self.out_of_time or (self._time_up(step) if self.signum is None else "")
        # one number says both, so every rank stops the same way: a clock counts 1, a signal world + 1 (more
        # than every rank's clock together, at any world size: a fixed 1000 read 1000 clocks as a signal)
        world = 1 if dist is None else int(dist.world)
        flag = float(world + 1) if self.signum is not None else 1.0 if self.out_of_time else 0.0
        if world <= 1:
            return flag > 0
        total = dist.sum(flag)
        if total == 0:
            return False
        if total > world and self.signum is None:  # another rank's signal: stop as if SIGTERM came here
            self.signum = signal.SIGTERM
        elif not self.out_of_time:
            self.out_of_time = "another rank's clock says the next step would end past the limit"
        return True

    def check(self, dist: Any, step: int, folder: Path, save: Callable[[], None]) -> None:
        """At a step boundary (`step` steps done): when a signal came on any rank, write the checkpoint of
        `step` through `save` (rank 0; every rank when the model is sharded) unless it is on disk already,
        wait for every rank, and raise `Preempted`."""
        first, self._checked = not self._checked, True
        main = dist is None or dist.main
        if first and main:  # this run goes on: an earlier stop's note is stale (STOP_FILE)
            with contextlib.suppress(OSError):
                (folder.parent / STOP_FILE).unlink(missing_ok=True)
        if not self.requested(dist, step):
            return
        on_disk = (self.resumed and first) or (step > 0 and not first and self.saved(step))
        if not on_disk and (main or getattr(dist, "sharded", False)):
            save()
        stop = Preempted(step, folder, self.signum, self.out_of_time)
        if dist is not None:
            if main:  # for processes outside `dist` (the split layout's rollout ranks): why the learners left
                announce(stop)
            dist.barrier()  # rank 0's save is complete before any rank exits
        if main:
            note(stop)
            print(f"toolgym: {stop}", file=sys.stderr, flush=True)
        raise stop


def for_run(cfg: Any, saved: Callable[[int], bool]) -> Preemption:
    """The handlers of a trainer's run config (`toolgym train`, `toolgym sft`): resumed or not, its time limit,
    its heavy steps; `saved(step)`: whether the loop itself writes the checkpoint after `step`."""
    return Preemption(bool(cfg.resume), saved, time_limit_s=cfg.time_limit(), heavy=heavy_steps(cfg))


def heavy_steps(cfg: Any) -> Callable[[int], bool]:
    """`Preemption`'s `heavy` for a run config: the steps that end with an evaluation (`eval_every`, the last
    step) or a checkpoint save (`save_every`)."""

    def heavy(step: int) -> bool:
        every = [getattr(cfg, "eval_every", 0), getattr(cfg, "save_every", 0)]
        return step == getattr(cfg, "steps", -1) or any(n and step % n == 0 for n in every)

    return heavy


def note(stop: Preempted) -> None:
    """``output_dir/preempted.json`` (`STOP_FILE`): the stop's step, exit code, signal and reason, for a requeue
    script under torchrun, whose own exit code is 1 whatever code its ranks exit with. Removed at the first
    step boundary of the next run (so a run that then finishes, or fails, leaves none)."""
    record = {"step": stop.step, "exit_code": stop.exit_code, "signal": stop.signum, "reason": stop.why}
    with contextlib.suppress(OSError):
        (stop.folder.parent / STOP_FILE).write_text(json.dumps(record) + "\n")


# ----- under torchrun: every rank ends with the stop's code ------------------------------------------------------
STORE_KEY = "toolgym/preempted"  # in torchrun's rendezvous store: the learners' stop, as JSON


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def _store() -> Any:
    """torchrun's key-value store (it lives in the launcher, so it outlasts the ranks), or None."""
    try:
        import torch.distributed as tdist
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store() if tdist.is_initialized() else None
    except (
        Exception
    ):  # (no torch.distributed, or no store: the rollout ranks then end on the lost connection)
        return None


def announce(stop: Preempted) -> None:
    """Writes `stop` where every process of the job can read it (`announced`)."""
    store = _store()
    if store is None:
        return
    with contextlib.suppress(Exception):
        store.set(STORE_KEY, json.dumps([stop.step, str(stop.folder), stop.signum, stop.why]))


def announced() -> Preempted | None:
    """The stop another process of this job announced (without waiting), else None."""
    store = _store()
    if store is None:
        return None
    try:
        if not store.check([STORE_KEY]):
            return None
        step, folder, signum, why = json.loads(store.get(STORE_KEY))
    except Exception:
        return None
    return Preempted(int(step), Path(folder), signum, why)


def exit_status(stop: Preempted) -> int:
    """The command's exit code for `stop`. Under torchrun the process ends here, at once (`os._exit`, after
    flushing): the trainer has saved and closed its envs, and what is left, the interpreter's teardown with
    threads still blocked in collectives of a group whose peers are gone, aborts (SIGABRT) or hangs."""
    if not under_torchrun():
        return stop.exit_code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(stop.exit_code)
