"""The trusted side of a code reward, run as the sandbox's code (its source is sent, then ``main()`` called).

It reads everything from stdin (solution, tests, the per-test runner's source, a report nonce) and wipes
stdin, so no test is ever on disk or readable by the candidate. Each test case runs in a fresh ``python -I``
process (:mod:`toolgym.rewards.code_child`) in an empty temporary directory, in its own session, killed at
``timeout`` seconds with everything it started; a ``conftest.py`` or any file the candidate writes is never
read (no pytest, no imports from the working directory). Expected outputs of program tests stay here and are
compared here. The report goes to stdout as one line: ``TOOLGYM-REPORT <nonce> <json>``.
Standard library only; nothing runs at import.
"""

from __future__ import annotations

REPORT_TAG = "TOOLGYM-REPORT"


def main() -> None:
    import contextlib
    import json
    import os
    import secrets
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    raw = sys.stdin.buffer.read()
    with contextlib.suppress(OSError):
        os.ftruncate(0, 0)  # the runner hands stdin over as a memory file: empty it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    payload = json.loads(raw)
    del raw
    nonce, tests, child = payload["nonce"], payload["tests"], payload["child"]
    timeout, output_cap = float(payload["timeout"]), int(payload.get("output_bytes", 1 << 20))
    results: list[dict[str, object]] = []
    for test in tests:
        workdir = tempfile.mkdtemp(prefix="tg-test-")
        read_fd, write_fd = os.pipe()
        out = tempfile.TemporaryFile()  # noqa: SIM115 (the child's stdout, read after it ends)
        test_nonce = secrets.token_hex(16)
        message = json.dumps(
            {
                "solution": payload["solution"],
                "test": test["run"],
                "nonce": test_nonce,
                "strict": payload["strict"],
            }
        ).encode()
        verdict, why = False, ""
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", child + "\nmain()\n", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
        os.close(write_fd)
        try:
            proc.communicate(message, timeout=timeout)
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout:g}s"
        except OSError as exc:  # the child closed stdin early: it failed on its own
            why = f"runner stopped reading: {exc}"
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it left running
        proc.wait()
        os.set_blocking(read_fd, False)
        try:
            line = os.read(read_fd, 4096).decode("utf-8", "replace").split("\n", 1)[0]
        except OSError:
            line = ""
        os.close(read_fd)
        if not why:
            if line.startswith(f"{test_nonce} PASS"):
                verdict = True
            elif line.startswith(f"{test_nonce} FAIL"):
                why = line[len(test_nonce) + 6 :]
            else:
                why = f"no report from the test run (exit status {proc.returncode})"
        if verdict and "expected" in test:
            out.seek(0)
            got = out.read(output_cap).decode("utf-8", "replace")
            expected = str(test["expected"])
            same = [ln.rstrip() for ln in got.strip().splitlines()] == [
                ln.rstrip() for ln in expected.strip().splitlines()
            ]
            verdict, why = same, "" if same else "wrong output"
        out.close()
        shutil.rmtree(workdir, ignore_errors=True)
        results.append({"id": test["id"], "passed": verdict, "why": why})
    sys.stdout.write(f"\n{REPORT_TAG} {nonce} {json.dumps({'results': results})}\n")
    sys.stdout.flush()
