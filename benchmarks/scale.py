"""Scale-out benchmarks: named keys into benchmarks/results/scale.json (each part is its own function).

``env_workers_speedup`` (CPU side; toolgym/ray_envs.py): episodes/s of N envs stepped in the trainer's
threads (``env_workers: threads``: the envs in this process, each env call on a thread of the episode
loop) against the same N envs as Ray actors on a 2-node Ray cluster started on this machine
(``env_workers: ray``), in the same run, alternating. The episodes are the scripted expert's (the policy
costs nothing, so the table is the env side alone) through ``EpisodeRunner`` (concurrency N, N env
threads), on two workloads with a real per-step cost:

- ``coding``: ``toolgym/Coding-v0`` on the docker sandbox, or the process sandbox (bubblewrap) with
  ``--sandbox process`` where there is no docker (the GPU machine): the expert runs its code in the episode's
  interpreter session, then submits: graded on the hidden tests in a sandbox. In-process the N episodes
  share one sandbox pool of N + 4 boxes (the env's documented size); on Ray each worker process has its own
  pool of 2 (its interpreter and its grader).
- ``python``: ``toolgym/Calculator-v0`` with a fixed amount of pure-Python work in each step, about 20 ms
  on one idle core (an env whose step holds the GIL: a text game's engine, a parser, a simulator).

Startup is timed apart: the cluster's ``ray start`` of both nodes, the first round's actors (one worker
process each), and the first episodes in-process. The timed runs follow a warm-up round in both modes.
``--node-cpus`` is each node's ``ray start --num-cpus`` (Ray's count for placing work; it pins no cores: on
one host the nodes, the trainer and the sandboxes share every core); ``--pin`` gives each node that many cores
of its own (``sched_setaffinity`` on its processes, which its workers and their sandboxes inherit) and the
trainer the rest, as if each node were a machine. The JSON records the machine (cores,
the 1-min load at the start and at the end), the sandbox and the nodes; ``env_workers_report FILE`` writes
the md and scale.json's key again from a JSON (one brought back from another machine, or an older one).

    python benchmarks/scale.py env_workers [--envs 8] [--episodes 32] [--repeats 2] [--workloads coding,python]
        [--sandbox docker|process] [--nodes 2] [--node-cpus 1] [--pin] [--results DIR]
    python benchmarks/scale.py env_workers_report benchmarks/results/scale_env_workers.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import toolgym  # noqa: F401  (registers the ids)

RESULTS = Path(__file__).resolve().parent / "results"
BUSY_ID = "bench/BusyCalculator-v0"


# ----- an env whose step holds the GIL --------------------------------------------------------------------
def _work(units: int) -> int:
    """A fixed amount of pure-Python work (the GIL held throughout, as in a Python game engine)."""
    return sum(sum(i * i for i in range(200)) for _ in range(units))


def units_for(ms: float) -> int:
    """How many units of ``_work`` take ``ms`` milliseconds on one idle core here (a fixed amount of work,
    not a wall-clock wait: threads sharing the GIL must each do all of theirs)."""
    t0 = time.perf_counter()
    _work(200)
    per_unit = (time.perf_counter() - t0) / 200
    return max(1, round(ms / 1000 / per_unit))


class BusyStep(gym.Wrapper[Any, Any, Any, Any]):
    """Calculator-v0 plus ``units`` of pure-Python work in every step."""

    def __init__(self, env: gym.Env[Any, Any], units: int) -> None:
        super().__init__(env)
        self.units = units

    def step(self, action: Any) -> Any:
        _work(self.units)
        return self.env.step(action)


def busy_calculator(units: int = 100, **kwargs: Any) -> gym.Env[Any, Any]:
    return BusyStep(gym.make("toolgym/Calculator-v0", **kwargs), units)


def _register_busy() -> None:
    if BUSY_ID not in gym.registry:
        # a module path the Ray workers import too (the benchmark puts benchmarks/ on their PYTHONPATH)
        gym.register(BUSY_ID, entry_point="scale:busy_calculator", disable_env_checker=True)


SANDBOXES = ("docker", "process")
WORKLOADS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (env id, kwargs in-process, kwargs on a Ray worker); sandbox pools are per process; the coding
    # sandbox is --sandbox's
    "coding": (
        "toolgym/Coding-v0",
        {"prompt_format": "text", "sandbox": "docker"},
        {"prompt_format": "text", "sandbox": "docker", "sandbox_options": {"pool_size": 2}},
    ),
    "python": (BUSY_ID, {"prompt_format": "text"}, {"prompt_format": "text"}),  # + units (20 ms of work)
}


def _episodes_per_s(runner: Any, env_id: str, kwargs: dict[str, Any], episodes: int, seed: int) -> float:
    from toolgym.agents import episode_specs

    t0 = time.perf_counter()
    trajs = runner.run(episode_specs([env_id], episodes, first_seed=seed, **kwargs))
    seconds = time.perf_counter() - t0
    bad = [t.error for t in trajs if not t.success]
    if bad:
        raise RuntimeError(f"{env_id}: {len(bad)} expert episodes failed, e.g. {bad[0]}")
    return episodes / seconds


# ----- --pin: each node on cores of its own ------------------------------------------------------------------
def pin_plan(cores: list[int], nodes: int, node_cpus: int) -> tuple[list[int], list[list[int]]]:
    """The trainer keeps the first cores, each node the next ``node_cpus`` (as if each were a machine)."""
    keep = len(cores) - nodes * node_cpus
    if keep < 1:
        raise ValueError(f"--pin: {nodes} nodes x {node_cpus} cores leave the trainer none of {len(cores)}")
    return cores[:keep], [cores[keep + i * node_cpus : keep + (i + 1) * node_cpus] for i in range(nodes)]


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (a node's ``ray start`` leads one: its GCS, raylet, workers)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return out


def pin_process(pid: int, cores: list[int]) -> None:
    """Every thread of ``pid`` (an affinity is a thread's; a child inherits its forking thread's)."""
    try:
        tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            continue


def _affinity(pid: int) -> set[int]:
    try:
        return set(os.sched_getaffinity(pid))
    except OSError:
        return set()


def env_workers_speedup(envs: int = 8, episodes: int = 32, repeats: int = 2,
                        workloads: tuple[str, ...] = ("coding", "python"), sandbox: str = "docker",
                        nodes: int = 2, node_cpus: int = 1, pin: bool = False) -> dict[str, Any]:  # fmt: skip
    """The ``env_workers_speedup`` key: per workload, episodes/s in threads and on Ray and their ratio.
    ``sandbox``: the coding workload's backend; ``nodes`` x ``node_cpus``: the local Ray cluster; ``pin``:
    the trainer (its env threads and their sandboxes) on the cores the nodes leave, each node (its workers
    and their sandboxes) on ``node_cpus`` cores of its own, so Ray's envs get cores the threads' do not."""
    from toolgym.agents import EpisodeRunner, ScriptedPolicy
    from toolgym.ray_envs import LocalCluster, RayEnvWorkers

    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox {sandbox!r}: expected one of {SANDBOXES}")
    if nodes < 1 or node_cpus < 1:
        raise ValueError(f"nodes ({nodes}) and node_cpus ({node_cpus}) must be >= 1")
    plan = pin_plan(sorted(os.sched_getaffinity(0)), nodes, node_cpus) if pin else None
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"workloads {unknown}: expected some of {sorted(WORKLOADS)}")
    _register_busy()
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    out: dict[str, Any] = {"envs": envs, "episodes": episodes, "repeats": repeats, "sandbox": sandbox,
                           "nodes": nodes, "node_cpus": node_cpus, "workloads": {}}  # fmt: skip
    if plan is not None:
        out["pin"] = {"trainer": plan[0], "nodes": plan[1]}
    t0 = time.perf_counter()
    with LocalCluster(nodes=nodes, num_cpus=node_cpus, env={"PYTHONPATH": path}) as cluster:
        out["cluster_start_s"] = cluster.start_s
        workers = RayEnvWorkers(cluster.address)

        def repin() -> None:  # before each phase: the nodes' new worker processes too
            if plan is not None:
                pin_process(os.getpid(), plan[0])
                for proc, cores in zip(cluster.procs, plan[1], strict=True):
                    for pid in session_pids(proc.pid):
                        pin_process(pid, cores)

        for name in workloads:
            env_id, local_kw, remote_kw = WORKLOADS[name]
            if name == "coding":
                local_kw = {**local_kw, "sandbox": sandbox, "sandbox_options": {"pool_size": envs + 4}}
                remote_kw = {**remote_kw, "sandbox": sandbox}
            if name == "python":
                units = units_for(20.0)  # the same work in both modes
                local_kw, remote_kw = {**local_kw, "units": units}, {**remote_kw, "units": units}
                out["python_units_per_step"] = units
            row: dict[str, Any] = {"env_id": env_id, "threads": [], "ray": []}
            local = EpisodeRunner(ScriptedPolicy(), concurrency=envs, env_workers=envs)
            remote = EpisodeRunner(
                ScriptedPolicy(), concurrency=envs, env_workers=envs, make_env=workers.env_factory()
            )
            try:
                repin()
                t = time.perf_counter()  # warm-up: the envs (and sandbox boxes, worker processes) made
                _episodes_per_s(local, env_id, local_kw, envs, 10_000)
                row["threads_first_round_s"] = time.perf_counter() - t
                t = time.perf_counter()
                _episodes_per_s(remote, env_id, remote_kw, envs, 10_000)
                row["ray_first_round_s"] = time.perf_counter() - t
                for r in range(repeats):  # alternating, same seeds in both
                    repin()
                    row["threads"].append(_episodes_per_s(local, env_id, local_kw, episodes, 100 * r))
                    row["ray"].append(_episodes_per_s(remote, env_id, remote_kw, episodes, 100 * r))
            finally:
                local.close()
                remote.close()
            row["threads_eps"] = statistics.median(row["threads"])
            row["ray_eps"] = statistics.median(row["ray"])
            row["speedup"] = row["ray_eps"] / row["threads_eps"]
            out["workloads"][name] = row
            if plan is not None:  # what the nodes' processes ran on (their workers included), as a check
                out["pin"]["seen"] = [
                    sorted(set().union(*(_affinity(p) for p in session_pids(proc.pid))))
                    for proc in cluster.procs
                ]
            print(f"{name}: threads {row['threads_eps']:.1f} ep/s, ray {row['ray_eps']:.1f} ep/s, "
                  f"x{row['speedup']:.2f}", file=sys.stderr, flush=True)  # fmt: skip
    out["total_s"] = time.perf_counter() - t0
    return out


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _machine(sandbox: str = "docker") -> dict[str, Any]:
    import ray

    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    out = {"host": platform.node(), "cpus": cpus, "cpus_usable": usable, "load_1min_at_start": _load(),
           "python": platform.python_version(), "ray": ray.__version__}  # fmt: skip
    if sandbox == "process":  # which bubblewrap ran the sandboxes
        import shutil
        import subprocess

        bwrap = shutil.which("bwrap")
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True) if bwrap else None
        out["bwrap"] = version.stdout.strip() if version and version.returncode == 0 else None
    return out


def _command(result: dict[str, Any]) -> str:
    """The command that made ``result`` (results before the command was recorded: rebuilt from its
    settings, which were all the flags then)."""
    if "command" in result:
        return str(result["command"])
    return (f"python benchmarks/scale.py env_workers --envs {result['envs']} --episodes {result['episodes']} "
            f"--repeats {result['repeats']}")  # fmt: skip


def _cores(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _placement(result: dict[str, Any], cpus: int) -> str:
    nodes, node_cpus = result.get("nodes", 2), result.get("node_cpus", 1)
    pin = result.get("pin")
    if pin is None:
        return (f"The {nodes} Ray nodes run on these same {cpus} cores (`ray start --num-cpus {node_cpus}` each: "
                "Ray's count for placing actors, no pinning), so Ray can only win by taking work off the "
                "trainer's GIL; on real CPU nodes each node brings its own cores.")  # fmt: skip
    nodes_at = "; ".join(f"node {i} on cores {_cores(c)}" for i, c in enumerate(pin["nodes"]))
    seen = pin.get("seen")
    if seen is not None and seen != pin["nodes"]:  # a process that escaped the pinning
        nodes_at += " (but the nodes' processes were seen on " + "; ".join(_cores(c) for c in seen) + ")"
    return (f"Pinned (`--pin`): the trainer, its env threads and their sandboxes on cores {_cores(pin['trainer'])}; "
            f"{nodes_at} (`ray start --num-cpus {node_cpus}` each; its workers and their sandboxes inherit its "
            "cores), as if each node were a machine of its own: Ray's envs get cores the threads' do not.")  # fmt: skip


def _num(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def write_env_workers(result: dict[str, Any], command: str | None = None, results: Path = RESULTS) -> None:
    """``results``/scale_env_workers.{json,md}, and the key in its scale.json (other keys kept). Reads
    results of every version (before ``sandbox``, ``nodes``, ``node_cpus`` and the load at the end were
    recorded: docker, 2 nodes of 1 CPU)."""
    if command is not None:
        result = {**result, "command": command}
    command = _command(result)
    sandbox, nodes, node_cpus = (
        result.get("sandbox", "docker"),
        result.get("nodes", 2),
        result.get("node_cpus", 1),
    )
    results.mkdir(parents=True, exist_ok=True)
    (results / "scale_env_workers.json").write_text(json.dumps(result, indent=2) + "\n")
    scale = results / "scale.json"
    data = json.loads(scale.read_text()) if scale.is_file() else {}
    m = result["machine"]
    data["env_workers_speedup"] = {
        name: {k: row[k] for k in ("threads_eps", "ray_eps", "speedup")}
        for name, row in result["workloads"].items()
    } | {"source": "scale_env_workers.json", "machine_cpus": m["cpus"], "sandbox": sandbox,
         "ray_nodes": f"{nodes} x {node_cpus} CPU"}  # fmt: skip
    scale.write_text(json.dumps(data, indent=2) + "\n")
    load = f"1-min load {_num(m.get('load_1min_at_start'))} at the start"
    if m.get("load_1min_at_end") is not None:
        load += f", {_num(m['load_1min_at_end'])} at the end"
    usable = (
        f" ({m['cpus_usable']} usable by this process)"
        if m.get("cpus_usable", m["cpus"]) != m["cpus"]
        else ""
    )
    box = f"the {sandbox} sandbox" + (f" ({m['bwrap']})" if m.get("bwrap") else "")
    lines = [
        f"# env_workers_speedup: envs in the trainer's threads vs Ray actors on {nodes} local nodes",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {m['host']}, {m['cpus']} CPU cores{usable} (shared with other work: {load}), "
        f"Python {m['python']}, Ray {m['ray']}; `coding` on {box}. " + _placement(result, m["cpus"]),
        "",
        f"{result['envs']} envs, {result['episodes']} scripted-expert episodes per run (EpisodeRunner, "
        f"concurrency {result['envs']}, {result['envs']} env threads), median of {result['repeats']} "
        "alternating runs after a warm-up round.",
        "",
        "| workload | env | threads ep/s | Ray ep/s | Ray / threads | runs (threads; Ray) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in result["workloads"].items():
        runs = f"{', '.join(f'{x:.1f}' for x in row['threads'])}; {', '.join(f'{x:.1f}' for x in row['ray'])}"
        lines.append(f"| {name} | `{row['env_id']}` | {row['threads_eps']:.1f} | {row['ray_eps']:.1f} | "
                     f"{row['speedup']:.2f} | {runs} |")  # fmt: skip
    lines += [
        "",
        "Startup (seconds):",
        "",
        "| what | s |",
        "|---|---|",
        f"| `ray start` head + worker node, the driver connected, until both are alive | "
        f"{result['cluster_start_s']:.1f} |",
    ]
    for name, row in result["workloads"].items():
        lines.append(f"| {name}: first {result['envs']} episodes in threads (envs made) | "
                     f"{row['threads_first_round_s']:.1f} |")  # fmt: skip
        lines.append(f"| {name}: first {result['envs']} episodes on Ray ({result['envs']} actors started) | "
                     f"{row['ray_first_round_s']:.1f} |")  # fmt: skip
    if "python_units_per_step" in result:
        lines += ["", f"`python`: {result['python_units_per_step']} units of work a step (about 20 ms on one idle core, "
                  "calibrated at the start of the run; the same in both modes)."]  # fmt: skip
    if m["cpus"] > 2 or "pin" in result:  # the reading below is the 2-core run's; another's is read by hand
        lines += ["", f"Whole benchmark: {result['total_s']:.0f} s.", ""]
        (results / "scale_env_workers.md").write_text("\n".join(lines))
        return
    lines += [
        "",
        "Reading: on this machine the two Ray nodes share the trainer's 2 cores with the trainer itself and with "
        "other work, so Ray's extra processes and its per-call hop (about 1 ms, plus the scripted policy's call "
        "for the expert's action on the worker) cost more than the GIL they free. Ray pays off where its nodes "
        "bring their own cores (a GIL-bound env on N CPU nodes) or where the trainer's host has no room for the "
        "envs (browsers, sandboxes on GPU hosts); the numbers here are the overhead's upper side.",
        "",
        f"Whole benchmark: {result['total_s']:.0f} s.",
        "",
    ]
    (results / "scale_env_workers.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("env_workers", help="env_workers_speedup: threads vs Ray actors (CPU)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workloads", default="coding,python")
    p.add_argument("--sandbox", choices=SANDBOXES, default="docker", help="the coding workload's sandbox")
    p.add_argument("--nodes", type=int, default=2, help="local Ray nodes (ray start each)")
    p.add_argument("--node-cpus", type=int, default=1, help="each node's ray start --num-cpus")
    p.add_argument(
        "--pin",
        action="store_true",
        help="each node on --node-cpus cores of its own, the trainer on the rest",
    )
    p.add_argument(
        "--results", type=Path, default=RESULTS, help="where the md and JSONs go (scale.json merged)"
    )
    r = sub.add_parser("env_workers_report", help="the md and scale.json's key again from a result JSON")
    r.add_argument("json", type=Path)
    r.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.part == "env_workers":
        machine = _machine(args.sandbox)
        result = env_workers_speedup(
            args.envs, args.episodes, args.repeats, tuple(w for w in args.workloads.split(",") if w),
            sandbox=args.sandbox, nodes=args.nodes, node_cpus=args.node_cpus, pin=args.pin,
        )  # fmt: skip
        machine["load_1min_at_end"] = _load()
        result["machine"] = machine
        write_env_workers(
            result, "python benchmarks/scale.py " + " ".join(_without_results(sys.argv[1:])), args.results
        )
    else:
        write_env_workers(json.loads(args.json.read_text()), results=args.results)
    print((args.results / "scale_env_workers.md").read_text())


def _without_results(argv: list[str]) -> list[str]:
    """``argv`` less ``--results DIR`` (where the files went is not part of the measurement)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--results":
            skip = True
        elif not a.startswith("--results="):
            out.append(a)
    return out


if __name__ == "__main__":
    main()
