"""Envs as Ray actors (toolgym/ray_envs.py) on a 2-node Ray cluster this module starts on this machine: a head
and a worker node (`ray start --block`, each with its own ports and temp dir, 1 CPU), stopped by the
fixture's finalizer (`toolgym.ray_envs.LocalCluster`: the two `ray start` processes and their process
groups, by id).

An episode through Ray equals the same episode in-process (Calculator-v0, the test env with forks, and
Coding-v0 on the docker sandbox when it is up); a worker killed mid-episode is that episode's `env_error`
and the next episode runs on a new actor; a GRPO step with a tiny CPU model runs with `env_workers: ray:…`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from tests.trainers.conftest import FAKE_ENV, register_fake_env
from toolgym.errors import ConfigError
from toolgym.ray_envs import RaySpec, parse_env_workers

REPO = Path(__file__).resolve().parents[2]
CALC = "toolgym/Calculator-v0"


# ----- no cluster ------------------------------------------------------------------------------------------
def test_parse_env_workers() -> None:
    assert parse_env_workers("threads") is None
    assert parse_env_workers("ray") == RaySpec()
    assert parse_env_workers("ray://h:10001") == RaySpec(address="ray://h:10001")
    assert parse_env_workers("ray:10.0.0.5:6379") == RaySpec(address="10.0.0.5:6379")
    for bad in ("", "ray:", "ray://", "processes", "8"):
        with pytest.raises(ConfigError, match="env_workers must be"):
            parse_env_workers(bad)


def test_config_and_cli_take_env_workers() -> None:
    from toolgym.cli import build_parser
    from toolgym.cli.train import resolve
    from toolgym.trainers.config import RunConfig

    assert RunConfig().env_workers == "threads"
    with pytest.raises(ConfigError, match="env_workers must be"):
        RunConfig(env_workers="rays")
    _, cfg = resolve(build_parser().parse_args(["train", "--env-workers", "ray://head:10001"]))
    assert cfg.env_workers == "ray://head:10001"
    args = build_parser().parse_args(["eval", CALC, "--env-workers", "ray"])
    assert args.env_workers == "ray"


def test_env_call_timeout_reaches_the_ray_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """`env_call_timeout_s` (config key, `--env-call-timeout-s`) is the workers' `RaySpec.call_timeout_s`."""
    from toolgym import ray_envs
    from toolgym.cli import build_parser
    from toolgym.cli.train import resolve
    from toolgym.trainers.config import RunConfig

    assert RunConfig().env_backend() == "threads"
    assert RunConfig(env_workers="ray").env_backend() == RaySpec(call_timeout_s=1800.0)
    flags = ["train", "ppo", "--env-workers", "ray:h:1", "--env-call-timeout-s", "60"]
    _, cfg = resolve(build_parser().parse_args(flags))
    assert cfg.env_backend() == RaySpec(address="h:1", call_timeout_s=60.0)
    assert RunConfig(env_workers="ray", env_call_timeout_s=0).env_backend().call_timeout_s is None  # wait
    with pytest.raises(ConfigError, match="env_call_timeout_s must be >= 0"):
        RunConfig(env_call_timeout_s=-1)
    made: list[Any] = []
    monkeypatch.setattr(ray_envs, "RayEnvWorkers", lambda spec: made.append(spec) or object())
    ray_envs.tree_envs({}, False, cfg.env_backend())
    assert made == [RaySpec(address="h:1", call_timeout_s=60.0)]


# ----- the cluster -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local() -> Iterator[Any]:
    """A head and a worker node on this machine, 1 CPU each (a `LocalCluster`, this process its driver)."""
    pytest.importorskip("ray")
    import ray

    from toolgym.ray_envs import LocalCluster

    if ray.is_initialized():
        pytest.skip("this process is already connected to another Ray cluster")
    # the workers import the test envs (tests/testing_env.py) that this process registers
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    with LocalCluster(nodes=2, num_cpus=1, env={"PYTHONPATH": path}) as local:
        print(f"\n2-node Ray cluster up in {local.start_s:.1f} s", file=sys.stderr)
        yield local


@pytest.fixture(scope="module")
def cluster(local: Any) -> str:
    """The cluster's `env_workers` value, `ray:127.0.0.1:PORT`."""
    return str(local.address)


@pytest.fixture(scope="module")
def workers(cluster: str) -> Any:
    from toolgym.ray_envs import RayEnvWorkers

    return RayEnvWorkers(cluster)


# ----- same episodes ---------------------------------------------------------------------------------------
def _expert_episode(env: Any, seed: int) -> list[Any]:
    """Everything a seeded expert episode returns: first obs and info, then each step's five values."""
    obs, info = env.reset(seed=seed)
    out: list[Any] = [obs, info]
    for _ in range(int(env.unwrapped.max_turns)):
        step = env.step(env.unwrapped.expert_action())
        out.append(tuple(step))
        if step[2] or step[3]:
            break
    return out


def test_actors_spread_over_both_nodes_and_episodes_match(workers: Any) -> None:
    kwargs = {"prompt_format": "text"}
    envs = [workers.make(CALC, kwargs) for _ in range(2)]
    try:
        assert len({e.node for e in envs}) == 2, "SPREAD puts the two actors on the two nodes"
        local = gym.make(CALC, **kwargs)
        for seed, env in zip((3, 4), envs, strict=True):
            assert _expert_episode(env, seed) == _expert_episode(local, seed)
        assert envs[0].unwrapped is envs[0] and envs[0].task.task_id  # attributes read on the worker
    finally:
        for e in envs:
            e.close()


def test_sandbox_episode_matches(workers: Any) -> None:
    from toolgym.sandboxes.docker_backend import docker_problem
    from toolgym.sandboxes.limits import Limits

    problem = docker_problem(Limits().image)
    if problem is not None:
        pytest.skip(f"the sandbox-backed episode needs the docker sandbox: {problem}")
    # a sandbox pool per worker process: one box for the interpreter, one for grading
    kwargs = {"prompt_format": "text", "sandbox": "docker", "sandbox_options": {"pool_size": 2}}
    remote = workers.make("toolgym/Coding-v0", kwargs)
    local = gym.make("toolgym/Coding-v0", **kwargs)
    try:
        got, want = _expert_episode(remote, 1), _expert_episode(local, 1)
    finally:
        remote.close()
        local.close()
    drop = ("elapsed_s", "duration_s", "exec_s", "time_s")  # wall times differ between any two runs
    assert _without(got, drop) == _without(want, drop)
    assert got[-1][2] and got[-1][4]["success"]


def _without(value: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, (list, tuple)):
        return type(value)(_without(v, keys) for v in value)
    return value


def _tree_view(forest: list[Any]) -> list[Any]:
    """Every node's contents but the snapshots (their `elapsed` clock differs between runs)."""

    def node(n: Any) -> tuple[Any, ...]:
        info = {k: v for k, v in n.info.items() if k != "snapshot"}
        return (n.parent, n.kind, n.token_ids, n.step_reward, n.reward, n.state_key, n.branch_reason, info)

    return [[node(n) for n in t.nodes] for t in forest]


@pytest.mark.parametrize("env_id", [FAKE_ENV, CALC])
def test_tree_rollout_through_ray_equals_threads(cluster: str, env_id: str) -> None:
    from tests.trainers.test_rollout import FakePolicy
    from toolgym.trainers.branching import TurnBoundaryEntropy
    from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout

    register_fake_env()
    forests = []
    for backend in ("threads", cluster):
        # branching: forks restore snapshots that crossed the hop (get_state on a worker, set_state on another)
        pol = TurnBoundaryEntropy(initial=2, beam_size=2, entropy_weight=10.0, consecutive_penalty=0.0)
        roller = TreeRollout(
            FakePolicy(), pol, RolloutConfig(budget=3, entropies=True), {"prompt_format": "text"},
            env_backend=backend,
        )  # fmt: skip
        try:
            forest, stats = roller.run([RolloutTask(env_id, 0)], seed=0)
        finally:
            roller.close()
        assert stats.env_errors == 0
        forests.append(forest)
    assert _tree_view(forests[1]) == _tree_view(forests[0])
    assert len(forests[0][0].leaves()) == 3


def test_toolgym_eval_runs_envs_on_ray(cluster: str, tmp_path: Path) -> None:
    from toolgym.cli import main

    argv = ["eval", CALC, "--agent", "scripted", "--episodes", "2", "--env-workers", cluster,
            "--env-kwargs", '{"prompt_format": "text"}', "--out", str(tmp_path), "--no-report", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all('"success": true' in ln for ln in lines)


def test_toolgym_eval_through_ray_client(local: Any, tmp_path: Path) -> None:
    """`--env-workers ray://HOST:PORT` from another process: Ray Client, through the head's client server."""
    from tests.processes import run

    argv = ["toolgym", "eval", CALC, "--agent", "scripted", "--episodes", "2", "--env-workers", local.client_address,
            "--env-kwargs", '{"prompt_format": "text"}', "--out", str(tmp_path), "--no-report", "--quiet"]  # fmt: skip
    done = run(argv, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "100.0%" in done.stdout


# ----- faults ----------------------------------------------------------------------------------------------
class _Killer:
    """A message-level policy that plays the expert and kills its env's worker before the turn of episode
    0 that `kill_at` names: that episode's next step finds no worker."""

    name = "killer"

    def __init__(self, kill_at: int) -> None:
        self.kill_at, self.turns, self.killed = kill_at, 0, 0

    def act(self, conversations: Any, tools: Any, sampling: Any = None, envs: Any = None) -> list[Any]:
        from toolgym.agents.policy import AssistantTurn
        from toolgym.messages import Message

        out = []
        for env in envs:
            self.turns += 1
            if self.turns == self.kill_at:
                os.kill(env.pid, signal.SIGKILL)  # the actor's process, by id
                self.killed = env.pid
            text = env.unwrapped.expert_action() if self.turns != self.kill_at else "7"
            out.append(AssistantTurn(text=text, message=Message(role="assistant", content=text)))
        return out


def test_killed_worker_is_env_error_and_the_next_episode_gets_a_new_one(workers: Any) -> None:
    from toolgym.agents.runner import EpisodeRunner, EpisodeSpec

    policy = _Killer(kill_at=2)  # Calculator's expert takes two turns: the kill lands mid-episode
    specs = [EpisodeSpec(CALC, s, (("prompt_format", "text"),)) for s in (5, 6)]
    with EpisodeRunner(policy, concurrency=1, make_env=workers.env_factory(), env_workers=1) as runner:  # type: ignore[arg-type]
        first, second = runner.run(specs)
        assert first.truncation == "env_error" and first.infra_failure and "lost" in str(first.error)
        assert not first.success
        assert second.error is None and second.success, second.error
        (pooled,) = runner._pool.drain()
        assert pooled.pid != policy.killed  # the second episode ran on a new actor
        pooled.close()


def test_killed_worker_mid_rollout_is_env_error_for_its_path_only(cluster: str) -> None:
    """A worker killed between a tree's turns: its path ends as env_error (no training row, not scored), the
    other paths finish, no leaf is lost or counted twice, and the next rollout replaces the actor."""
    from tests.trainers.test_rollout import FakePolicy
    from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
    from toolgym.trainers.tree import flatten

    register_fake_env()

    class KillOnce(FakePolicy):
        def __init__(self, roller: Any = None) -> None:
            super().__init__()
            self.roller, self.victim = roller, 0

        def generate(self, prompts: list[list[int]], sampling: Any = None) -> Any:
            if len(self.calls) == 1 and self.roller is not None:  # the second round: turn 1 of every path
                env = self.roller.envs._wrappers[0]
                self.victim = env.pid
                os.kill(env.pid, signal.SIGKILL)
            return super().generate(prompts, sampling)

    policy = KillOnce()
    roller = TreeRollout(policy, None, RolloutConfig(budget=3), {}, env_backend=cluster)
    policy.roller = roller
    try:
        forest, stats = roller.run([RolloutTask(FAKE_ENV, 0)], seed=0)
        tree = forest[0]
        eps = [tree.nodes[leaf].info["episode"] for leaf in tree.leaves()]
        assert len(eps) == 3 and stats.env_errors == 1
        assert sorted(e["truncation"] or "" for e in eps) == ["", "", "env_error"]
        assert len(flatten(forest)) == 2  # the env_error path gives no training row
        policy.roller = None
        again, stats2 = roller.run([RolloutTask(FAKE_ENV, 1)], seed=1)
        assert stats2.env_errors == 0 and len(again[0].leaves()) == 3
        assert policy.victim not in {e.pid for e in roller.envs._pool.drain()}
    finally:
        roller.close()


# ----- attacks: envs that misbehave inside their actor ----------------------------------------------------
HOSTILE = "tests/HostileRay-v0"
MISBEHAVE = ("ok", "raise", "unpicklable", "unpicklable-exception", "hang", "die", "ok")


class _Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("this exception does not pickle")


class _Hostile(gym.Wrapper):  # type: ignore[type-arg]
    """The test env (VowelCount) whose step misbehaves when the model's text says so (see MISBEHAVE)."""

    def step(self, action: Any) -> Any:
        import threading
        import time

        text = str(action)
        if text == "raise":
            raise OSError("the container went away")
        if text == "unpicklable":
            obs, *rest = self.env.step("x")
            return [*obs, {"role": "tool", "content": threading.Lock()}], *rest
        if text == "unpicklable-exception":
            raise _Unpicklable("no")
        if text == "hang":
            time.sleep(120)
        if text == "die":
            os._exit(3)
        return self.env.step(action)


def _make_hostile(**kwargs: Any) -> Any:
    from tests.testing_env import VowelCountEnv

    return _Hostile(VowelCountEnv(**kwargs))


class _Misbehave:
    """Plays episode k's first turn as MISBEHAVE[k] (the runner runs them one by one), then "ok"."""

    name = "misbehave"

    def __init__(self) -> None:
        self.episodes = 0

    def act(self, conversations: Any, tools: Any, sampling: Any = None, envs: Any = None) -> list[Any]:
        from toolgym.agents.policy import AssistantTurn
        from toolgym.messages import Message

        out = []
        for conv in conversations:
            first = not any(m.get("role") == "assistant" for m in conv)
            text = MISBEHAVE[self.episodes] if first else "ok"
            self.episodes += first
            out.append(AssistantTurn(text=text, message=Message(role="assistant", content=text)))
        return out


def test_env_faults_inside_actors_are_env_errors_of_their_episodes_only(cluster: str) -> None:
    """An env that raises, returns an observation that cannot be pickled, raises an exception that cannot be,
    hangs past call_timeout_s, or kills its worker: each is that episode's env_error (an infrastructure
    failure, never scored), counted once; the episodes around them run on healthy (new) actors."""
    from toolgym.agents.runner import EpisodeRunner, EpisodeSpec
    from toolgym.ray_envs import RayEnvWorkers

    if HOSTILE not in gym.registry:
        gym.register(HOSTILE, entry_point=_make_hostile, disable_env_checker=True)
    workers = RayEnvWorkers(RaySpec(address=parse_env_workers(cluster).address, call_timeout_s=2.0))  # type: ignore[union-attr]
    specs = [EpisodeSpec(HOSTILE, seed, ()) for seed in range(len(MISBEHAVE))]
    with EpisodeRunner(_Misbehave(), concurrency=1, make_env=workers.env_factory(), env_workers=1) as runner:  # type: ignore[arg-type]
        trajs = runner.run(specs)
        for env in runner._pool.drain():
            env.close()
    assert [t.seed for t in trajs] == list(range(len(MISBEHAVE)))  # each episode once, none lost
    faulty = {k for k, what in enumerate(MISBEHAVE) if what != "ok"}
    for k, traj in enumerate(trajs):
        if k in faulty:
            assert traj.truncation == "env_error" and traj.infra_failure and not traj.success, (k, traj.error)
        else:
            assert traj.error is None and traj.truncation != "env_error", (k, traj.error)
    errors = {MISBEHAVE[k]: str(trajs[k].error) for k in faulty}
    assert "the container went away" in errors["raise"]
    assert "cannot be sent back (pickle)" in errors["unpicklable"]
    assert "InfrastructureError" in errors["unpicklable-exception"]
    assert "lost" in errors["hang"] and "GetTimeoutError" in errors["hang"]
    assert "lost" in errors["die"]
    assert workers.lost_workers == 2  # the hung and the dead worker


def test_default_call_timeout_is_finite() -> None:
    """(Was None: a hung env hung the run forever.)"""
    assert RaySpec().call_timeout_s is not None and RaySpec().call_timeout_s > 0


# ----- a training step -------------------------------------------------------------------------------------
def test_grpo_step_with_env_workers_on_ray_and_a_worker_killed_mid_step(
    cluster: str, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GRPO step (tiny CPU model) with envs on Ray, one env worker killed inside the step's rollout (as
    its first env step is sent): the step finishes and trains, the killed episode is counted once, as a
    truncated (env_error) episode, and no other is lost."""
    pytest.importorskip("torch")
    from tests.trainers.conftest import tiny_model
    from toolgym.ray_envs import RayTreeEnvs
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    killed: list[int] = []
    stepper = RayTreeEnvs.stepper

    def kill_first(self: Any, env: Any, text: str) -> Any:
        step = stepper(self, env, text)

        def call() -> Any:
            if not killed:  # the first env step of the run: its worker dies as the step goes out
                killed.append(env.pid)
                os.kill(env.pid, signal.SIGKILL)
            return step()

        return call

    monkeypatch.setattr(RayTreeEnvs, "stepper", kill_first)
    cfg = GRPOConfig(
        env_ids=[FAKE_ENV], env_kwargs={}, prompts_per_step=2, budget=2, max_new_tokens=4, max_total_tokens=128,
        lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=1, micro_batch_rows=4,
        steps=1, output_dir=str(tmp_path), env_workers=cluster, env_call_timeout_s=300,
    )  # fmt: skip
    metrics = train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)  # type: ignore[arg-type]
    assert len(killed) == 1
    assert metrics["rollout/episodes"] == 4 and metrics["charts/truncated_fraction"] >= 0.25
    assert metrics["rollout/env_errors"] == metrics["rollout/lost_env_workers"] == 1  # logged per step
    assert "losses/policy" in metrics and "eval/success" in metrics


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from tests.trainers.conftest import tiny_tokenizer

    return tiny_tokenizer()


# ----- last: a node of the cluster goes away (the module's cluster keeps one node after this) --------------
def test_a_lost_node_is_env_error_for_its_envs_and_new_envs_go_to_the_live_node(
    local: Any, workers: Any
) -> None:
    """The worker node crashes (its `ray start` process group killed; its actors exit when they see their
    raylet gone): a step of the env that lived there raises InfrastructureError (its episode's env_error), the env on the head answers on, and a new env
    is placed on the live node (the soft affinity falls back) without waiting for the dead one."""
    import time

    from toolgym.errors import InfrastructureError

    kwargs = {"prompt_format": "text"}
    envs = [workers.make(CALC, kwargs) for _ in range(2)]
    assert len({e.node for e in envs}) == 2
    for e in envs:
        e.reset(seed=1)
    os.killpg(local.procs[1].pid, signal.SIGKILL)  # the worker node crashes: its `ray start` group, by id
    local.procs[1].wait(timeout=60)
    deadline = time.monotonic() + 60  # its workers see their raylet gone and exit
    while all(_alive(e.pid) for e in envs) and time.monotonic() < deadline:
        time.sleep(0.1)
    outcomes: list[str] = []
    for e in envs:
        try:
            e.step("<answer>0</answer>")
            outcomes.append("ok")
        except InfrastructureError as exc:
            assert "lost" in str(exc)
            outcomes.append("lost")
    assert sorted(outcomes) == ["lost", "ok"], outcomes
    t0 = time.monotonic()
    fresh = workers.make(CALC, kwargs)
    assert _expert_episode(fresh, 2)[-1][2]  # a whole episode, on the head
    assert time.monotonic() - t0 < 60
    for e in [*envs, fresh]:
        e.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
