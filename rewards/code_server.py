"""The candidate's side of a function test: a "function server" inside a sandbox session.

Sent as source into the session (after :mod:`toolgym.rewards.code_wire`, whose functions it uses), then
driven by the host one call per session run:

- ``_tg_load()``: runs the candidate's code (the run's stdin) as module ``solution`` and reports the names of
  its top-level functions;
- ``_tg_call()``: reads ``{"fn", "args", "kwargs"}`` (wire form) from stdin, calls the function, and reports
  the result, or the exception's type and message, plus the arguments the call changed in place.

Each report is one line ``\\x1eTGR <json>`` written to fd 1 after everything the candidate printed (its own
prints during a call go to a discarded buffer). Nothing here is trusted: this process is the candidate's, and
whatever it reports is simply the candidate's answer, checked by the tests in another process.
"""

from __future__ import annotations

from typing import Any

MARK = "\x1eTGR "
_TG: dict[str, Any] = {}  # the wire module and the candidate's module, set by the session's boot code


def _tg_report(obj: Any) -> None:
    import json
    import os

    data = ("\n" + MARK + json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _tg_load() -> None:
    import sys
    import types

    source = sys.stdin.read()
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    _TG["module"] = module
    try:
        exec(compile(source, "solution.py", "exec"), module.__dict__)
    except BaseException as exc:  # SystemExit too: a module that leaves early defines nothing usable
        sys.stdout.flush()
        _tg_report({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        return
    sys.stdout.flush()
    names = sorted(
        name
        for name, value in module.__dict__.items()
        if not name.startswith("__") and callable(value) and not isinstance(value, type(sys))
    )
    _tg_report({"names": names})


def _tg_call() -> None:
    import io
    import sys

    wire = _TG["wire"]
    request = wire.loads(sys.stdin.read())
    args, kwargs = list(request["args"]), dict(request["kwargs"])
    sent = [wire.dumps(a) for a in args]
    fn = getattr(_TG["module"], request["fn"], None)
    if not callable(fn):
        _tg_report({"exc": "NameError", "msg": f"name {request['fn']!r} is not defined"})
        return
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()  # the candidate's prints: kept out of the report stream
    try:
        try:
            result = fn(*args, **kwargs)
        finally:
            sys.stdout = real_stdout
    except Exception as exc:
        _tg_report({"exc": type(exc).__name__, "msg": str(exc)[:500]})
        return
    try:
        changed = {}
        for i, arg in enumerate(args):
            if type(arg) in (list, dict, set, bytearray):
                now = wire.dumps(arg)
                if now != sent[i]:
                    changed[str(i)] = wire.to_wire(arg)
        _tg_report({"value": wire.to_wire(result), "changed": changed})
    except (wire.WireError, RecursionError, ValueError, TypeError) as exc:
        _tg_report({"exc": "NotPlainData", "msg": str(exc)[:200]})
