"""Grading one program: the candidate and the tests in separate processes, plain data and proxies between them.

Two graders, both returning a :class:`Grade`:

- :func:`grade_function`: the candidate defines functions and classes; trusted tests use them. The
  candidate's code runs in a sandbox session as an object server
  (:mod:`toolgym.rewards.code_object_server`); the
  tests run on the host in a fresh ``python -I`` process (:mod:`toolgym.rewards.code_runner`) that never
  imports or sees the candidate's code; the candidate's names there are proxies
  (:mod:`toolgym.rewards.code_proxy`), and each call, attribute or operator crosses as plain data
  (:mod:`toolgym.rewards.code_wire`) relayed by this module; requests that call back into the tests run in a
  fork of the session, kept only when they finish. Test shapes: a list of assert statements, a test
  module with ``def test_*()`` functions, or HumanEval's ``check(candidate)`` with an ``entry_point``.
- :func:`grade_program`: stdin/stdout programs; each case is one fresh sandbox run, the expected output never
  leaves the host and is compared here.

The verdict is the test process's one report on a pipe only this process holds; the candidate's process
cannot reach it (another process, in a sandbox: for docker another container and uid). A grader that ran
the candidate and got no valid report scores every case failed; ``Grade.infra_error`` (a None reward) is
kept for failures the candidate could not have caused: the sandbox failing before the candidate's code was
sent, the test process not starting, the dataset's test code not compiling, or a sandbox that still fails
for a fresh probe run after the candidate's call.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import importlib.util
import json
import marshal
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.rewards.code_object_server import MARK
from toolgym.rewards.code_runner import BOOT

_HERE = Path(__file__).parent
_WIRE = (_HERE / "code_wire.py").read_text()
_SERVER = (_HERE / "code_object_server.py").read_text()
_RUNNER = (_HERE / "code_runner.py").read_text()
_PROXY = (_HERE / "code_proxy.py").read_text()
_REMOTE = (_HERE / "code_remote.py").read_text()


def _compiled(source: str, name: str) -> str:
    """The source compiled once here, marshalled and base64'd: an interpreter of this very build loads it
    in well under a millisecond instead of compiling 20-60 KB of source for every candidate."""
    return base64.b64encode(marshal.dumps(compile(source, name, "exec"))).decode("ascii")


# the test process runs this very interpreter: it always gets the compiled forms
_RUNNER_ARGS = [
    _compiled(_WIRE, "code_wire.py"),
    _compiled(_REMOTE, "code_remote.py"),
    _compiled(_PROXY, "code_proxy.py"),
    _compiled(_RUNNER, "code_runner.py"),
]
# a sandbox session gets both; it loads the compiled ones only when its Python reads this bytecode version
_SESSION_JOB = json.dumps(
    {
        "wire": _WIRE,
        "server": _SERVER,
        "build": importlib.util.MAGIC_NUMBER.hex(),
        "wire_c": _compiled(_WIRE, "code_wire.py"),
        "server_c": _compiled(_SERVER, "code_object_server.py"),
    }
)
_SESSION_BOOT = (
    "import json as _j, sys as _s, types as _t\n"
    "_src = _j.loads(_s.stdin.read())\n"
    "def _tg_code(key, file):\n"
    "    if _src.get('build') == _s.modules['_frozen_importlib_external'].MAGIC_NUMBER.hex():\n"
    "        import base64, marshal\n"
    "        return marshal.loads(base64.b64decode(_src[key + '_c']))\n"
    "    return compile(_src[key], file, 'exec')\n"
    "_w = _t.ModuleType('_tg_wire')\n"
    "exec(_tg_code('wire', 'code_wire.py'), _w.__dict__)\n"
    "_s.modules['_tg_wire'] = _w\n"
    "exec(_tg_code('server', 'code_object_server.py'), globals())\n"
    "del _src, _tg_code\n"
    "_TG = {'wire': _w}\n"
    "_tg_report({'ready': True})\n"
)
RUNNER_MEMORY_MB = 2048  # address space of the test process
RUNNER_SLACK_S = 10.0
LOAD_MIN_S = 10.0  # the least time loading the candidate's module may take  # the test code's own time on top of the candidate's budgets


@dataclass(frozen=True)
class Grade:
    """The outcome of grading one candidate: ``passed`` of ``total`` test cases, with a reason per failed
    case; ``infra_error`` non-empty means the run says nothing about the candidate (score None)."""

    passed: int
    total: int
    why: tuple[str, ...] = ()
    infra_error: str = ""

    def score(self, partial: bool = False) -> float | None:
        """1.0 when every case passed (``partial``: the fraction), else 0.0; None on an infrastructure error."""
        if self.infra_error or not self.total:
            return None
        return self.passed / self.total if partial else float(self.passed == self.total)


def _failed(total: int, why: str) -> Grade:
    return Grade(0, total, (why,) * total)


def _report(stdout: str) -> dict[str, Any] | None:
    """The last report line the candidate's process wrote (it is the candidate's answer, nothing more)."""
    at = stdout.rfind("\n" + MARK)
    if at < 0:
        return None
    line = stdout[at + 1 + len(MARK) :].split("\n", 1)[0]
    try:
        report = json.loads(line)
    except (ValueError, RecursionError):  # garbage, or nesting deep enough to exhaust the parser
        return None
    return report if isinstance(report, dict) else None


def _probe_failed(sandbox: Any) -> bool:
    """Whether a fresh, trivial run fails too: then a sandbox_error was the infrastructure's, not the
    candidate's."""
    try:
        return bool(sandbox.run("print(1)", timeout=20).status == "sandbox_error")
    except Exception:
        return True


def _job(tests: Any, entry_point: str | None) -> dict[str, Any]:
    """The test process's job: kind and case list, from any accepted test shape."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as exc:
            raise ConfigError(f"the test code does not parse: {exc}") from exc
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        if entry_point and "check" in defined:
            return {"kind": "check", "source": tests, "cases": ["check"]}
        names = [n for n in defined if n.startswith("test")]
        if names:
            return {"kind": "module", "source": tests, "cases": names}
        return {"kind": "asserts", "cases": [tests]}
    if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
        for t in tests:
            try:
                ast.parse(t)
            except SyntaxError as exc:
                raise ConfigError(f"a test does not parse: {exc}") from exc
        return {"kind": "asserts", "cases": list(tests)}
    raise ConfigError(
        "function tests are a list of asserts, a test module (str) with def test_*(), or a check(candidate) "
        "source with an entry_point."
    )


def _classes(prelude: str, job: dict[str, Any]) -> list[str]:
    """The classes the trusted code defines at top level (a prelude's ``ListNode``): their instances cross by
    value, rebuilt on each side with that side's class of the same name."""
    sources = [prelude, job.get("source", "")] + (job["cases"] if job["kind"] == "asserts" else [])
    names: set[str] = set()
    for src in sources:
        with contextlib.suppress(SyntaxError, ValueError):
            names.update(n.name for n in ast.parse(src).body if isinstance(n, ast.ClassDef))
    return sorted(names)


def _asks(reply: dict[str, Any]) -> bool:
    """Whether a relayed reply is the candidate asking the tests to answer a callback first."""
    raw = reply.get("raw")
    if not isinstance(raw, str):
        return False
    try:
        return "need" in json.loads(raw)
    except (ValueError, RecursionError):
        return False


class _Candidate:
    """The candidate's function server in one sandbox session; reloaded in a fresh interpreter for the next
    test case when it died."""

    def __init__(self, sandbox: Any, code: str, timeout: float, byval: list[str]) -> None:
        self.sandbox, self.code, self.timeout, self.byval = sandbox, code, timeout, byval
        self.session: Any = None
        self.names = ""  # the load report: the candidate's names, for the test process
        self.load_error = ""
        self.dead_in: int | None = None  # the case during which the interpreter died
        self.charged = 0.0

    def start(self) -> str:
        """Boots the server and loads the candidate; returns an infrastructure error ("" when fine)."""
        self.session = self.sandbox.session()
        boot = self.session.run(_SESSION_BOOT, timeout=30, stdin=_SESSION_JOB)
        if _report(boot.stdout) != {"ready": True}:
            return f"the sandbox session did not start: {boot.status} {boot.detail}".strip()
        self.load()
        return ""

    def load(self) -> None:
        # imports (numpy takes seconds on a busy machine) get more than one case's budget
        job = json.dumps({"code": self.code, "byval": self.byval})
        result = self.session.run("_tg_load()", timeout=max(2 * self.timeout, LOAD_MIN_S), stdin=job)
        report = _report(result.stdout) if not result.restarted else None
        if report is None or not isinstance(report.get("names"), dict):
            why = report.get("error") if report else f"{result.status}: {result.detail or 'no report'}"
            self.load_error = f"the code did not load: {why}"[:300]
            if result.status == "sandbox_error" and _probe_failed(self.sandbox):
                raise InfrastructureError(result.detail)
            self.names = ""
            return
        self.load_error = ""
        self.names = json.dumps(report)

    def call(
        self, request: str, case: int, budget: float, branch: bool = False
    ) -> tuple[dict[str, Any], float]:
        """A reply for the test process (``{"raw": report text}`` or ``{"crash": why}``) and the seconds to
        charge to the case: the sandbox's own timing of the call, so the relay's overhead on a busy machine
        never eats the candidate's budget.

        ``branch``: the tests have handed the candidate callables, so the request may stop to ask one and be
        replayed from its start with the answer: it runs in a fork of the session, kept only when it
        finished (a replay then starts from the state before the request, not after half of it)."""
        main = self.session
        fork = None
        if branch and self.dead_in is None and not self.load_error:
            try:
                fork = self.session.fork()
            except Exception:  # a backend without fork: replays run on the session itself
                fork = None
        if fork is not None:
            self.session = fork
        try:
            reply = self._call(request, case, budget)
        except BaseException:
            if fork is not None:
                self.session = main
                with contextlib.suppress(Exception):
                    fork.close()
            raise
        if fork is not None:
            keep, drop = (main, fork) if _asks(reply) else (fork, main)
            self.session = keep
            with contextlib.suppress(Exception):
                drop.close()
        return reply, self.charged

    def _call(self, request: str, case: int, budget: float) -> dict[str, Any]:
        self.charged = 0.0
        if self.dead_in is not None:
            if self.dead_in == case:
                return {"crash": "the candidate's interpreter died earlier in this test"}
            self.dead_in = None
            with contextlib.suppress(InfrastructureError):
                self.session.run(_SESSION_BOOT, timeout=30, stdin=_SESSION_JOB)
                self.load()
        if self.load_error:
            return {"crash": self.load_error}
        if budget <= 0:
            return {"crash": f"time limit of {self.timeout:g}s for this test exceeded"}
        t0 = time.monotonic()
        result = self.session.run("_tg_call()", timeout=max(0.1, budget), stdin=request)
        wall = time.monotonic() - t0
        self.charged = result.duration_s if 0 < result.duration_s <= wall else wall
        report = _report(result.stdout) if not result.restarted else None
        if (
            result.status == "ok"
            and report is not None
            and ("value" in report or "exc" in report or "need" in report)
        ):
            try:
                return {"raw": json.dumps(report)}
            except (ValueError, RecursionError):
                return {"crash": "malformed answer"}
        if result.status == "sandbox_error" and _probe_failed(self.sandbox):
            raise InfrastructureError(result.detail)
        self.dead_in = case
        return {
            "crash": f"no answer from the candidate ({result.status}: {result.detail or 'no report'})"[:300]
        }

    def close(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()


@dataclass
class _Runner:
    """The test process on the host, with its pipes."""

    proc: subprocess.Popen[bytes]
    rx: int
    buf: bytearray = field(default_factory=bytearray)

    @classmethod
    def start(cls, job: dict[str, Any]) -> _Runner:
        read_fd, write_fd = os.pipe()
        job = {**job, "memory_mb": RUNNER_MEMORY_MB}  # the runner limits itself (no preexec_fn in threads)
        workdir = tempfile.gettempdir()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, *_RUNNER_ARGS, str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                cwd=workdir,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        runner = cls(proc, read_fd)
        runner.send(job)
        return runner

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, deadline: float) -> Any:
        """The next message, or None when the process ended or the deadline passed."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.rx], [], [], left)
            if not ready:
                return None
            data = os.read(self.rx, 1 << 16)
            if not data:
                return None
            self.buf += data
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.rx)


def grade_function(
    code: str,
    tests: Any,
    *,
    entry_point: str | None = None,
    prelude: str = "",
    sandbox: Any,
    timeout: float = 5.0,
) -> Grade:
    """Grades functions the candidate defines against trusted tests (see the module docstring).

    ``tests``: a list of assert statements (one case each); a test module with ``def test_*()`` functions
    (one case each); or, with ``entry_point``, a source defining HumanEval's ``check(candidate)`` (one case,
    called with the candidate's ``entry_point``). ``prelude`` is trusted code run first in both processes
    (HumanEval's prompt: its helpers, such as ``poly``, are the test's own, never the candidate's; the
    candidate may use them too). ``timeout``: the candidate's time per test case, all its calls together.
    """
    job = _job(tests, entry_point)
    total = len(job["cases"])
    job["prelude"], job["entry_point"] = prelude, entry_point
    job["byval"] = _classes(prelude, job)
    candidate = _Candidate(sandbox, f"{prelude}\n{code}" if prelude else code, timeout, job["byval"])
    runner: _Runner | None = None
    try:
        try:
            problem = candidate.start()
        except InfrastructureError as exc:
            return Grade(0, total, infra_error=str(exc))
        if problem:
            return Grade(0, total, infra_error=problem)
        job["load"] = candidate.names
        try:
            runner = _Runner.start(job)
        except OSError as exc:
            return Grade(0, total, infra_error=f"the test process did not start: {exc}")
        used = [0.0] * total
        deadline = time.monotonic() + total * timeout + RUNNER_SLACK_S
        while True:
            message = runner.recv(deadline)
            if not isinstance(message, dict):
                return _failed(total, "the tests did not finish (time limit, or the test process died)")
            if "report" in message:
                results = message["report"]
                if not isinstance(results, list) or len(results) != total:
                    return _failed(total, "malformed report")
                passed = sum(bool(isinstance(r, dict) and r.get("passed") is True) for r in results)
                why = tuple(str(r.get("why", "")) if isinstance(r, dict) else "" for r in results)
                return Grade(passed, total, why)
            if "setup_error" in message:
                return Grade(0, total, infra_error=f"the test code failed: {message['setup_error']}")
            case = int(message.get("case", 0)) % total
            t0 = time.monotonic()
            try:
                reply, charged = candidate.call(
                    str(message.get("call", "")), case, timeout - used[case], message.get("branch") is True
                )
            except InfrastructureError as exc:
                return Grade(0, total, infra_error=str(exc))
            used[case] += charged
            deadline += max(0.0, time.monotonic() - t0 - charged)  # the relay's overhead is nobody's time
            runner.send(reply)
    finally:
        if runner is not None:
            runner.close()
        candidate.close()


def _same_output(got: str, expected: str) -> bool:
    """Line by line, trailing spaces and leading/trailing blank lines ignored."""
    return [ln.rstrip() for ln in got.strip().splitlines()] == [
        ln.rstrip() for ln in expected.strip().splitlines()
    ]


def grade_program(code: str, cases: list[dict[str, Any]], *, sandbox: Any, timeout: float = 5.0) -> Grade:
    """Grades a stdin/stdout program: each ``{"input": ..., "output": ...}`` case is one fresh sandbox run
    of ``code`` as ``__main__`` with that stdin; a case passes when the run exits 0 within ``timeout`` and its
    stdout (not truncated) equals ``output`` line by line (trailing spaces ignored), compared here."""
    for case in cases:
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise ConfigError('a program test case needs "input" and "output".')
    passed, why = 0, []
    for case in cases:
        try:
            result = sandbox.run(code, timeout=timeout, stdin=str(case["input"]))
        except InfrastructureError as exc:
            return Grade(0, len(cases), infra_error=str(exc))
        if result.status == "sandbox_error":
            if _probe_failed(sandbox):
                return Grade(0, len(cases), infra_error=result.detail or "sandbox_error")
            why.append(f"sandbox_error: {result.detail}")
            continue
        if result.status != "ok" or result.truncated:
            why.append(
                f"{result.status}{' (output truncated)' if result.truncated else ''}: {result.detail}"[:300]
            )
            continue
        if _same_output(result.stdout, str(case["output"])):
            passed += 1
            why.append("")
        else:
            why.append("wrong output")
    return Grade(passed, len(cases), tuple(why))
