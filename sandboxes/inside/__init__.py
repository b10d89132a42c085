"""The supervisor that runs *inside* the sandbox: a container (docker backend) or a child process (process
backend). A stdlib-only package, bind-mounted read-only into containers at /opt/toolgym/inside, with no
imports outside itself; the host imports `frames` from it. Nothing runs at import time.

Modes (`launch_args`):

- ``init``: PID 1 of the container. It only reaps orphans. A PID-1 process cannot be killed from inside its
  own pid namespace, so code that runs ``kill(-1, 9)`` or ``kill(1, 9)`` cannot stop the container (docker's
  own ``--init`` would exit as soon as its single child is killed).
- ``serve``: the protocol server (`server`), started by the host on a ``docker exec`` stream (or a pipe).
  It reads request frames on stdin and writes reply frames on stdout (`frames`). It forks *workers*
  (`worker`), one persistent Python interpreter each, and enforces the per-call wall clock and the output
  cap itself; the host keeps a second, looser wall clock in case this process is stopped or killed.

What is covered: wall-clock kills of a worker's whole process group; processes that escape with
``setsid``/double fork (the server is a child subreaper, so orphans come back to it and are killed,
`procs`); output capped at the source; invalid UTF-8 (bytes travel raw); OOM told apart from other kills
through the memory cgroup's ``oom_kill`` counter; workers forked copy-on-write for session branches; the
server and init are non-dumpable, so the code cannot ptrace them.
What is not covered: anything the kernel and the container settings do not enforce. The server trusts the
host and not the code; the code runs under the same uid, so it can kill or stop the server; the host
notices (stream closed, or its own deadline) and replaces the sandbox.
"""


def launch_args(root: str, mode: str) -> list[str]:
    """Python arguments that run ``mode`` from this package placed in directory ``root``.

    >>> launch_args("/opt/toolgym", "init")[-1]
    'init'
    """
    code = f"import sys; sys.path.insert(0, {root!r}); from inside.main import main; main()"
    return ["-c", code, mode]
