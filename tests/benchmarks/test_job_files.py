"""Every GPU job line runs as far as its argument parsing, here and without a GPU: a wrong flag, a renamed
option, a missing script or config, or a pytest ``-k`` that selects nothing costs a whole device call.

benchmarks/jobs/*.txt: each line (``GPU NAME COMMAND``) is rewritten as benchmarks/gpu_jobs.sh rewrites it
(``$RUNS``; ``--resume auto --time-limit-s N`` after each ``toolgym train `` / ``toolgym sft ``), its shell
variables expanded with the values the driver exports, then split into commands (``;``, ``&&``, ``|``,
redirections, ``VAR=value`` prefixes). Each command:
  python SCRIPT ARGS          the script's own argparse parser accepts ARGS (tests/benchmarks/parse_only.py
                              runs the script and stops it right after parsing);
  toolgym train|sft|dpo ...   the real CLI parses, and ``--config`` exists and resolves with the flags;
  python -m pytest ARGS       ``pytest --collect-only`` with ARGS collects at least one test;
  python -c CODE              CODE compiles.
A generator whose output a later command of the line reads (``papers/run.py configs``) is run for real, into
a temporary $RUNS. The shell drivers (papers/device.sh, gpu_fsdp.sh, gpu_proofs.sh, …) hold functions,
arrays and ``"$@"``, so only what can be read off them reliably is checked: the scripts and configs they name
exist, and each ``--flag`` written after a ``python benchmarks/X.py`` or ``-m toolgym train|sft|dpo`` is an
option of that parser.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import processes

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "benchmarks" / "jobs"
DRIVERS = [
    "benchmarks/gpu_jobs.sh",
    "benchmarks/papers/device.sh",
    "benchmarks/gpu_fsdp.sh",
    "benchmarks/gpu_proofs.sh",
    "benchmarks/vllm_device.sh",
]
RUNNER = Path(__file__).with_name("parse_only.py")
# the seconds gpu_jobs.sh leaves a job (its $JOB_SECONDS; --time-limit-s is 30 less)
LEFT = 495
# commands a job may run that have no parser of ours to check
SHELL_TOOLS = {"pip", "pip3", "tail", "head", "echo", "cat", "cp", "mv", "mkdir", "ls", "rm", "tar", "sleep",
               "nvidia-smi", "true", "test", "du", "wc", "grep", "sed"}  # fmt: skip
# (script, first argument) pairs that only write files a later command of the same line reads: run for real
GENERATORS = {("benchmarks/papers/run.py", "configs")}
SEPARATORS = {";", "&&", "||", "|", "&"}
REDIRECTS = {">", ">>", "<", ">&", "&>", ">|"}
VARIABLE = re.compile(r"\$\{(\w+)(?:(:-|:\+|-|\+)([^}]*))?\}|\$(\w+)")


@dataclasses.dataclass(frozen=True)
class JobLine:
    file: str
    lineno: int
    gpu: str
    name: str
    cmd: str

    @property
    def id(self) -> str:
        return f"{Path(self.file).stem}:{self.name}"


def job_lines() -> list[JobLine]:
    out = []
    for path in sorted(JOBS.glob("*.txt")):
        for i, raw in enumerate(path.read_text().splitlines(), 1):
            parts = raw.split(None, 2)  # as `read -r gpu name cmd` splits it
            if not parts or parts[0].startswith("#"):
                continue
            gpu, name, cmd = [*parts, "", ""][:3]
            out.append(JobLine(str(path.relative_to(REPO)), i, gpu, name, cmd))
    return out


def driver_env(runs: str, gpu: str) -> dict[str, str]:
    """What a job's shell sees (gpu_jobs.sh's exports and the job's own variables)."""
    return {
        "RUNS": runs, "JOB_SECONDS": str(LEFT), "CUDA_VISIBLE_DEVICES": gpu, "PYTHONPATH": "/tmp/site",
        "PYTHONUNBUFFERED": "1", "TOOLGYM_CACHE": "/root/toolgym-cache", "HOME": "/root",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "OUT": "/tmp/out",
    }  # fmt: skip


def as_gpu_jobs_runs_it(cmd: str, runs: str) -> str:
    """gpu_jobs.sh's rewriting of a job's command (the same literal replacements)."""
    cmd = cmd.replace("$RUNS", runs)
    limit = LEFT - 30 if LEFT > 60 else 30
    for sub in ("train", "sft"):
        cmd = cmd.replace(f"toolgym {sub} ", f"toolgym {sub} --resume auto --time-limit-s {limit} ")
    return cmd


def expand(text: str, env: dict[str, str]) -> str:
    """``$X``, ``${X}``, ``${X:-default}``, ``${X:+word}`` as bash expands them; a variable that is neither set
    nor defaulted is an error (bash would pass an empty string, which is never what a job line meant)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, word = m.group(2), m.group(3) or ""
        if op in (":+", "+"):
            return word if env.get(name) else ""
        if name in env and (env[name] or op != ":-"):
            return env[name]
        if op in (":-", "-"):
            return word
        raise ValueError(f"${name} is not set where the line runs")

    return VARIABLE.sub(one, text)


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line: split at ; && || | &, without redirections and VAR= prefixes."""
    text = re.sub(r"(?<!\S)\d*>&\d+", " ", text)  # 2>&1
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in SEPARATORS:
            commands.append([])
        elif tok in REDIRECTS:
            i += 1  # its target
        elif tok in ("(", ")", "((", "))") or tok.startswith("$("):
            raise ValueError(f"unsupported shell construct {tok!r}: keep job lines to simple commands")
        else:
            commands[-1].append(tok)
        i += 1
    out = []
    for cmd in commands:
        while cmd and re.match(r"^[A-Za-z_]\w*=", cmd[0]):
            cmd = cmd[1:]
        if cmd:
            out.append(cmd)
    return out


@dataclasses.dataclass
class Check:
    """One command's check: a request to parse_only.py, a pytest collection, or a verdict already known."""

    what: str
    request: dict[str, Any] | None = None
    pytest_args: tuple[str, ...] | None = None
    error: str | None = None


def check_of(cmd: list[str]) -> Check:
    what = shlex.join(cmd)[:160]
    head = Path(cmd[0]).name
    if head in ("python", "python3"):
        if len(cmd) < 2:
            return Check(what, error="python with no script")
        if cmd[1] == "-m" and len(cmd) > 2 and cmd[2] == "pytest":
            return Check(what, pytest_args=tuple(cmd[3:]))
        if cmd[1] == "-m" and len(cmd) > 2 and cmd[2] == "toolgym":
            return Check(what, request={"mode": "parse", "script": "toolgym", "argv": cmd[3:]})
        if cmd[1] == "-c":
            try:
                compile(cmd[2], "<job -c>", "exec")
            except (SyntaxError, IndexError) as exc:
                return Check(what, error=f"python -c does not compile: {exc}")
            return Check(what, error="")
        if cmd[1].startswith("-"):
            return Check(
                what, error=f"python {cmd[1]}: not a form this test knows (script, -m pytest|toolgym, -c)"
            )
        script, argv = cmd[1], cmd[2:]
        mode = "execute" if (script, argv[0] if argv else "") in GENERATORS else "parse"
        return Check(what, request={"mode": mode, "script": script, "argv": argv})
    if head == "toolgym":
        return Check(what, request={"mode": "parse", "script": "toolgym", "argv": cmd[1:]})
    if head == "bash" and len(cmd) > 1:
        ok = (REPO / cmd[1]).is_file()
        return Check(what, error="" if ok else f"{cmd[1]}: no such file")
    if head in SHELL_TOOLS:
        return Check(what, error="")
    return Check(
        what, error=f"{cmd[0]}: a command this test does not know (add it to SHELL_TOOLS if harmless)"
    )


def checks_of_line(line: JobLine, runs: str) -> list[Check]:
    problems = []
    if not re.fullmatch(r"\d+(,\d+)*", line.gpu):
        problems.append(Check(line.gpu, error=f"GPU field {line.gpu!r} is not a CUDA_VISIBLE_DEVICES list"))
    if not line.cmd.strip():
        return [*problems, Check(line.name, error="no command")]
    try:
        text = expand(as_gpu_jobs_runs_it(line.cmd, runs), driver_env(runs, line.gpu))
        commands = shell_commands(text)
    except ValueError as exc:
        return [*problems, Check(line.cmd[:160], error=str(exc))]
    return problems + [check_of(cmd) for cmd in commands]


# --- the drivers ----------------------------------------------------------------------------------------------

PATHS = re.compile(r"(?<![\w/.$-])((?:benchmarks|trainers/configs|tests)/[\w./-]+\.(?:py|yaml|yml|sh|txt))\b")
INVOCATION = re.compile(r"(?:python3?\s+(benchmarks/[\w/.-]+\.py)|-m\s+toolgym\s+(train|sft|dpo))\b(.*)")


def logical_lines(text: str) -> list[str]:
    """A shell file's lines without comments, backslash continuations joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw)  # (a `#` inside a quoted string would be cut too: none here)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def flags_of(tail: str) -> list[str] | None:
    """The ``--flags`` of a command's arguments up to the end of the command (``$( … )`` skipped); None when
    the shell text cannot be tokenised reliably (a quote left open across lines, a heredoc)."""
    try:
        lexer = shlex.shlex(tail, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens, depth = [], 0
        for tok in lexer:
            if tok == "(":
                depth += 1
            elif tok in (")", "))"):
                if depth == 0:
                    break  # the end of the subshell the command runs in
                depth -= 1
            elif depth == 0 and (tok in SEPARATORS or tok in REDIRECTS):
                break
            elif depth == 0:
                tokens.append(tok)
    except ValueError:
        return None
    return [t.split("=", 1)[0] for t in tokens if re.match(r"^--[A-Za-z][\w-]*", t)]


def wrappers(text: str) -> dict[str, str]:
    """Shell functions that pass their own arguments (``"$@"``) on to ``toolgym SUB``: name -> "toolgym SUB"."""
    out = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\w+)\(\)\s*\{(.*)$", line)
        if not m:
            continue
        body = m.group(2)
        if not body.rstrip().endswith("}"):  # a function of several lines ends at a `}` of its own line
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("}")), len(lines))
            body = "\n".join(lines[i + 1 : end])
        sub = re.search(r"-m\s+toolgym\s+(train|sft|dpo)\b", body)
        if sub and '"$@"' in body:
            out[m.group(1)] = f"toolgym {sub.group(1)}"
    return out


def driver_invocations(text: str) -> list[tuple[str, list[str]]]:
    """(script or "toolgym SUB", its --flags) for each invocation written out in a driver, and for each call
    of a shell function that wraps ``toolgym SUB … "$@"`` (``train GPU NAME CONFIG --flags…``)."""
    out = []
    lines = logical_lines(text)
    wrapping = wrappers(text)
    calls = {name: re.compile(rf"(?:^|[\s(;&|])(?<!toolgym ){name}\s+(.*)") for name in wrapping}
    for line in lines:
        for m in INVOCATION.finditer(line):
            flags = flags_of(m.group(3))
            if flags is not None:
                out.append((m.group(1) or f"toolgym {m.group(2)}", flags))
        for name, call in calls.items():  # (one call a line: the drivers write one a line)
            called = call.search(line)
            if called and not re.match(rf"\s*{name}\(\)", line):
                flags = flags_of(called.group(1))
                if flags is not None:
                    out.append((wrapping[name], flags))
    return out


def known(flag: str, options: set[str]) -> bool:
    """argparse accepts an option or an unambiguous prefix of one (allow_abbrev)."""
    return flag in options or len([o for o in options if o.startswith(flag)]) == 1


# --- running the checks -------------------------------------------------------------------------------------

LINES = job_lines()


def run_requests(requests: list[dict[str, Any]], runs: Path) -> list[dict[str, Any]]:
    if not requests:
        return []
    done = processes.run([sys.executable, str(RUNNER)], 180, input=json.dumps(requests), cwd=REPO)
    assert done.returncode == 0, f"parse_only.py failed:\n{done.stderr[-3000:]}"
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def collect(args: tuple[str, ...]) -> str:
    """'' when ``pytest --collect-only ARGS`` selects at least one test, else why not."""
    done = processes.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], 300, cwd=REPO)
    if done.returncode == 0:
        return ""
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
    return f"pytest --collect-only selects no test (rc {done.returncode}):\n{tail}"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every check of every job line and driver, run once: parse_only.py once for them all (the lines in
    their order, so a generator writes before a later command reads), one collection per pytest command."""
    pytest.importorskip("torch")  # the scripts import it at their top
    runs = tmp_path_factory.mktemp("runs")
    lines = {line.id: checks_of_line(line, str(runs)) for line in LINES}
    drivers = {d: driver_invocations((REPO / d).read_text()) for d in DRIVERS if (REPO / d).is_file()}
    targets = sorted({t for invocations in drivers.values() for t, _ in invocations})
    requests = [c.request for checks in lines.values() for c in checks if c.request is not None]
    for target in targets:
        script, *sub = target.split()
        requests.append({"mode": "options", "script": script, "argv": sub})
    results = iter(run_requests(requests, runs))
    for checks in lines.values():
        for c in checks:
            if c.request is not None:
                r = next(results)
                c.error = "" if r["ok"] else r["error"]
    options = {t: next(results) for t in targets}
    collected: dict[tuple[str, ...], str] = {}
    for checks in lines.values():
        for c in checks:
            if c.pytest_args is not None:
                if c.pytest_args not in collected:
                    collected[c.pytest_args] = collect(c.pytest_args)
                c.error = collected[c.pytest_args]
    return {"lines": lines, "drivers": drivers, "options": options}


@pytest.mark.parametrize("line", LINES, ids=[line.id for line in LINES])
def test_a_job_line_parses_as_gpu_jobs_runs_it(line: JobLine, verdicts: dict[str, Any]) -> None:
    failures = [f"  {c.what}\n    -> {c.error}" for c in verdicts["lines"][line.id] if c.error]
    assert not failures, f"{line.file}:{line.lineno} ({line.name}):\n" + "\n".join(failures)


def test_job_names_are_unique_per_file() -> None:
    """gpu_jobs.sh marks a job done by its NAME: a second line of the same name would never run."""
    for path in sorted({line.file for line in LINES}):
        names = [line.name for line in LINES if line.file == path]
        assert len(names) == len(set(names)), f"{path}: a name twice in {names}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_driver_names_scripts_and_flags_that_exist(driver: str, verdicts: dict[str, Any]) -> None:
    path = REPO / driver
    assert path.is_file(), f"{driver} is gone: drop it from DRIVERS"
    text = "\n".join(logical_lines(path.read_text()))
    missing = sorted({p for p in PATHS.findall(text) if not (REPO / p).exists()})
    assert not missing, f"{driver} names files that do not exist: {missing}"
    problems = []
    for target, flags in verdicts["drivers"][driver]:
        result = verdicts["options"][target]
        if not result["ok"]:
            problems.append(f"{target}: {result['error']}")
            continue
        options = set(result["options"])
        problems += [f"{target} {flag}: no such option" for flag in flags if not known(flag, options)]
    assert not problems, f"{driver}:\n" + "\n".join(problems)


def test_shell_lines_split_as_bash_runs_them() -> None:
    env = {"RUNS": "/r", "JOB_SECONDS": "400"}
    text = expand(
        "A=1 python x.py --s ${JOB_SECONDS:-495} --c ${CALLS:-3}${NOPE:+--x} > $RUNS/o 2>&1; tail -3 f", env
    )
    assert shell_commands(text) == [["python", "x.py", "--s", "400", "--c", "3"], ["tail", "-3", "f"]]
    assert shell_commands('p a.py --sweep "b=1;b=2" --static= && toolgym sft --x 1 | cat') == [
        ["p", "a.py", "--sweep", "b=1;b=2", "--static="], ["toolgym", "sft", "--x", "1"], ["cat"],
    ]  # fmt: skip
    with pytest.raises(ValueError, match="UNSET"):
        expand("--n $UNSET", env)
    assert as_gpu_jobs_runs_it("a && toolgym train --config c", "/r").endswith(
        f"toolgym train --resume auto --time-limit-s {LEFT - 30} --config c"
    )
    lines = logical_lines('python3 benchmarks/x.py --a 1 \\\n  --b "$v" > out  # --c\n# --d')
    assert driver_invocations("\n".join(lines)) == [("benchmarks/x.py", ["--a", "--b"])]


def test_a_broken_line_is_caught(tmp_path: Path) -> None:
    """The mistakes this test exists for, each on a line of its own, each reported."""
    pytest.importorskip("torch")
    broken = {
        "flag": "python benchmarks/decode_attn.py --swep --out $RUNS/x",
        "script": "python benchmarks/no_such_bench.py --out $RUNS/x",
        "config": "toolgym train --config trainers/configs/no_such.yaml --seed 1",
        "field": "toolgym sft --config trainers/configs/learning_sft.yaml --no-such-field 3",
        "variable": "python benchmarks/decode_attn.py --out $OUTDIR",
        "program": "pyhton benchmarks/decode_attn.py",
    }
    checks = {
        name: checks_of_line(JobLine("jobs/x.txt", 1, "0", name, cmd), str(tmp_path))
        for name, cmd in broken.items()
    }
    requests = [c.request for cs in checks.values() for c in cs if c.request is not None]
    results = iter(run_requests(requests, tmp_path))
    for cs in checks.values():
        for c in cs:
            if c.request is not None:
                c.error = "" if next(results)["ok"] else "failed"
    assert {name: all(c.error for c in cs) for name, cs in checks.items()} == dict.fromkeys(broken, True)
    assert collect(("-p", "no:cacheprovider", __file__, "-k", "no_test_is_named_so"))
