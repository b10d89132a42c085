"""Envs as Ray actors: ``env_workers: ray | ray://ADDRESS | ray:ADDRESS`` (``toolgym train``/``eval``).

Each env (a sandbox session, a browser, a text game) lives in its own Ray actor, placed round robin over
the cluster's live nodes with CPUs (or with ``RaySpec.resources``, to keep envs on CPU nodes), and the trainer or ``toolgym eval`` holds a ``RemoteEnv`` proxy in its place.
The episode loop already runs env calls as closures on a thread pool; a proxy's ``reset``/``step``/``close``
send the call to the actor and wait for it on that thread, so while one env works on another node the loop
keeps generating and stepping the others. The rest of the rollout is unchanged: the same trees, the same
pools, the same faults.

Where the envs run (``parse_env_workers``):

- ``threads`` (default): in the trainer's process, as before.
- ``ray``: ``ray.init()``: the cluster in ``RAY_ADDRESS``, else the one last started on this machine
  (``ray start``), else a new local one.
- ``ray://HOST:PORT``: a remote cluster through Ray Client (the head's client server, port 10001 by default).
- ``ray:ADDRESS``: ``ray.init(ADDRESS)`` as given, e.g. ``ray:10.0.0.5:6379`` (the GCS address, from a
  node of the cluster) or ``ray:auto``.

Faults: a worker that dies (its process killed, its node lost) or does not answer within ``call_timeout_s``
(1800 s by default: a hung env must not hang the run, and a reset that pulls an image may take minutes) raises ``InfrastructureError`` from the call (the
actor is killed), which the loops already turn into ``truncation == "env_error"`` for that episode (never
scored as the model's failure); the loops close a broken env and make a new one, which is a new actor. An
idle pooled proxy whose actor died is given a new actor at its next ``reset`` (nothing of an episode is
lost there). An exception the env itself raises comes back as that exception (a ``ConfigError`` stays
one, and still ends the run); one that cannot be pickled back, and a result that cannot (an observation
holding a lock), is an ``InfrastructureError`` naming it. ``RayEnvWorkers.lost_workers`` counts the workers
lost, ``replaced`` the idle ones replaced. The head going away: Ray ends the driver process once it has
not reached the GCS for ``RAY_gcs_rpc_server_reconnect_timeout_s`` (60 s); calls to live workers go on
meanwhile (docs/scale.md).

What crosses the hop (pickled by Ray, cloudpickle): the env id with the driver's ``EnvSpec`` (so ids a
plugin or a test registered in the driver work when their entry point imports on the workers), the
``gym.make`` kwargs, seeds, actions, observations, ``info``, fork snapshots (``get_state``) and the task.
What cannot: live objects tied to a process, e.g. a ``Sandbox`` object, a client, a lock, an open file or
socket given as a kwarg (pass a backend name such as ``sandbox="docker"`` and options instead: each worker
makes its own), and a snapshot whose ``extra_state`` holds such an object. A ``ParsedAction`` read on the
driver is not sent: the worker parses the model's text itself (``step_text``), as ``step`` would.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.trainers.rollout_envs import TreeEnvs

THREADS = "threads"


@dataclass(frozen=True)
class RaySpec:
    """Where the env actors run: ``address`` for ``ray.init`` (None: Ray's own lookup), and how each is placed.

    ``num_cpus``: CPUs an actor reserves (None: Ray's default for actors, 1 to be placed and 0 while it runs,
    so any number fit a node); ``resources``: custom resources an actor needs (e.g. ``{"env_node": 0.01}``
    to keep envs on the CPU nodes started with ``--resources '{"env_node": 100}'``); ``call_timeout_s``: a
    call that takes longer is a lost worker (None: wait); ``start_timeout_s``: for a new actor to answer
    (an actor no node can place waits forever otherwise)."""

    address: str | None = None
    num_cpus: float | None = None
    resources: dict[str, float] = field(default_factory=dict)
    call_timeout_s: float | None = 1800.0  # (a reset may pull a container image: minutes; a hang: forever)
    start_timeout_s: float = 120.0


def parse_env_workers(value: str) -> RaySpec | None:
    """None for ``threads``; the ``RaySpec`` of ``ray``, ``ray://HOST:PORT`` or ``ray:ADDRESS``.

    >>> parse_env_workers("threads") is None, parse_env_workers("ray").address
    (True, None)
    >>> parse_env_workers("ray://10.0.0.5:10001").address, parse_env_workers("ray:auto").address
    ('ray://10.0.0.5:10001', 'auto')
    """
    text = str(value).strip()
    if text == THREADS:
        return None
    if text == "ray":
        return RaySpec()
    if text.startswith("ray://"):
        if len(text) > len("ray://"):
            return RaySpec(address=text)
    elif text.startswith("ray:") and len(text) > len("ray:"):
        return RaySpec(address=text[len("ray:") :])
    raise ConfigError(
        f"env_workers must be 'threads', 'ray', 'ray://HOST:PORT' (Ray Client) or 'ray:ADDRESS', got {value!r}"
    )


_CONNECT_LOCK = threading.Lock()


def connect(spec: RaySpec) -> Any:
    """The ``ray`` module, connected to ``spec.address`` (once a process; a later different address is an
    error: Ray holds one connection per process)."""
    from toolgym.optional import require

    ray = require("ray", why="env workers on Ray (env_workers: ray)")
    with _CONNECT_LOCK:
        # Ray Client (ray://) starts a server process on the head for each client; on a busy head that start
        # can miss Ray's deadline ("Starting Ray client server failed"): a second start usually makes it
        tries = 3 if str(spec.address or "").startswith("ray://") else 1
        for attempt in range(tries):
            if ray.is_initialized():
                break
            try:
                # quiet: the workers' stdout would interleave with the trainer's progress bar
                ray.init(address=spec.address, log_to_driver=False, logging_level="WARNING")
            except ConnectionError:
                if attempt == tries - 1:
                    raise
                time.sleep(2.0 * (attempt + 1))
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _lost_types(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's exceptions for a worker that is gone or does not answer (not the env's own exceptions)."""
    ex = ray.exceptions
    names = ("RayActorError", "ActorUnavailableError", "WorkerCrashedError", "ObjectLostError",
             "OwnerDiedError", "GetTimeoutError", "NodeDiedError")  # fmt: skip
    return tuple(getattr(ex, n) for n in names if isinstance(getattr(ex, n, None), type))


class EnvWorker:
    """The actor: one env made with ``gym.make`` (``unwrap``: stepped through its ``ToolEnv``, as the tree
    rollout steps envs; else through its gymnasium wrappers, as ``toolgym eval`` does)."""

    def __init__(self, env: Any, kwargs: dict[str, Any], unwrap: bool) -> None:
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids in this worker)
        from toolgym.envs.base import tool_env

        self.wrapped = gym.make(env, **kwargs)
        self.env: Any = tool_env(self.wrapped) if unwrap else self.wrapped

    def describe(self) -> dict[str, Any]:
        """What the proxy keeps: the worker's process and node, and whether the env forks."""
        import ray

        inner = self.wrapped.unwrapped
        return {
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "supports_fork": bool(getattr(inner, "supports_fork", False)),
        }

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)  # type: ignore[no-any-return]

    def step(self, action: Any) -> tuple[Any, ...]:
        return tuple(self.env.step(action))

    def step_text(self, text: str, snapshots: bool) -> tuple[Any, ...]:
        """The tree rollout's env call (``TreeEnvs.stepper``) in one hop: parse, step, snapshot."""
        from toolgym.envs.base import action_reader

        reader = action_reader(self.env)
        read = reader(text) if reader is not None else None
        obs, reward, terminated, truncated, info = self.env.step(read if read is not None else text)
        snap = None
        if snapshots and not (terminated or truncated) and self.env.supports_fork:
            snap = self.env.get_state()
        return obs, reward, terminated, truncated, info, snap, read

    def get_state(self) -> Any:
        return self.env.get_state()

    def set_state(self, state: Any) -> None:
        self.env.set_state(state)

    def attr(self, name: str) -> tuple[bool, Any]:
        """(True, None) for a method of the ToolEnv (the proxy calls it with ``call``), else (False, its
        value): the proxy is its own ``unwrapped``, so attributes are the innermost env's."""
        value = getattr(self.wrapped.unwrapped, name)
        return (True, None) if callable(value) else (False, value)

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.wrapped.unwrapped, name)(*args, **kwargs)

    def close(self) -> None:
        self.wrapped.close()


class RemoteEnv:
    """A proxy of an ``EnvWorker`` actor with an env's interface (``reset``, ``step``, ``close``,
    ``get_state``/``set_state``, ``supports_fork``, and any other attribute or method of the env, fetched
    or called on the worker). ``unwrapped`` is the proxy itself. Thread-safe as an env is: one call at a time."""

    remote = True  # what the loops may ask to tell a proxy from an env

    def __init__(self, workers: RayEnvWorkers, env_id: str, kwargs: dict[str, Any], unwrap: bool) -> None:
        self._workers, self.env_id, self._kwargs, self._unwrap = workers, env_id, dict(kwargs), unwrap
        self._actor: Any = None
        self.pid = 0
        self.node = ""
        self.supports_fork = False
        self._start()

    # ----- the actor ---------------------------------------------------------------------------------------
    def _start(self) -> None:
        """A new actor. One that dies before it runs (placed on a node that has just died, which the cluster
        still lists as alive) is made again, on the next node of the round robin; one that no node takes
        within ``start_timeout_s`` is not (another try would wait as long)."""
        tries = 3
        for attempt in range(tries):
            self._actor = self._workers.new_actor(self.env_id, self._kwargs, self._unwrap)
            try:
                about = self._get(self._actor.describe.remote(), self._workers.spec.start_timeout_s)
                break
            except InfrastructureError as exc:
                timed_out = type(exc.__cause__).__name__ == "GetTimeoutError"
                if timed_out or attempt == tries - 1:
                    raise
        self.pid, self.node, self.supports_fork = about["pid"], about["node"], about["supports_fork"]

    def _get(self, ref: Any, timeout: float | None = -1.0) -> Any:
        """The call's result; a lost worker raises InfrastructureError, the env's own exception itself."""
        ray = self._workers.ray
        wait = self._workers.spec.call_timeout_s if timeout == -1.0 else timeout
        try:
            return ray.get(ref, timeout=wait)
        except ray.exceptions.RayTaskError as exc:  # the env raised: that exception, as in-process
            cause = getattr(exc, "cause", None)
            if isinstance(cause, TypeError) and "pickle" in str(cause):  # its result cannot cross the hop
                raise InfrastructureError(
                    f"env worker of {self.env_id}: its result cannot be sent back (pickle): {cause}"
                ) from None
            if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None
            raise InfrastructureError(f"env worker of {self.env_id}: {_first_line(exc)}") from None
        except self._workers.lost as exc:
            self._kill()
            with self._workers._lock:
                self._workers.lost_workers += 1
            raise InfrastructureError(
                f"env worker of {self.env_id} (pid {self.pid}) lost: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        except ray.exceptions.RayError as exc:  # e.g. the env's exception could not be pickled back
            raise InfrastructureError(f"env worker of {self.env_id}: {_first_line(exc)}") from None

    def _kill(self) -> None:
        if self._actor is not None:
            with contextlib.suppress(Exception):  # already gone
                self._workers.ray.kill(self._actor, no_restart=True)
            self._actor = None

    def _remote(self, method: str, *args: Any) -> Any:
        if self._actor is None:
            raise InfrastructureError(f"env worker of {self.env_id} is closed or was lost")
        return self._get(getattr(self._actor, method).remote(*args))

    # ----- the env's interface -----------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """A new episode; a worker lost while idle (in a pool) is replaced first: no episode is cut."""
        if self._actor is not None:
            try:
                return self._remote("reset", seed, options)  # type: ignore[no-any-return]
            except InfrastructureError:
                pass  # the actor is gone: a new one below
        with self._workers._lock:
            self._workers.replaced += 1
        self._start()
        return self._remote("reset", seed, options)  # type: ignore[no-any-return]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._remote("step", action)  # type: ignore[no-any-return]

    def step_text(self, text: str, snapshots: bool) -> tuple[Any, ...]:
        return self._remote("step_text", text, snapshots)  # type: ignore[no-any-return]

    def get_state(self) -> Any:
        return self._remote("get_state")

    def set_state(self, state: Any) -> None:
        self._remote("set_state", state)

    @property
    def unwrapped(self) -> RemoteEnv:
        return self

    def close(self) -> None:
        if self._actor is None:
            return
        try:
            self._get(self._actor.close.remote(), timeout=30.0)
        except Exception:  # closing a broken env must not end the run
            pass
        finally:
            self._kill()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private names (and pickling's probes) stay local
            raise AttributeError(name)
        is_method, value = self._remote("attr", name)
        if not is_method:
            return value
        return lambda *args, **kwargs: self._remote("call", name, args, kwargs)

    def __repr__(self) -> str:
        return f"RemoteEnv({self.env_id!r}, pid={self.pid}, node={self.node[:8]})"


class RayEnvWorkers:
    """Makes ``RemoteEnv``s on the cluster of ``spec`` (connecting on first use) and counts replacements."""

    def __init__(self, spec: RaySpec | str) -> None:
        parsed = parse_env_workers(spec) if isinstance(spec, str) else spec
        if parsed is None:
            raise ConfigError("RayEnvWorkers needs a Ray address ('ray', 'ray://…', 'ray:…'), not 'threads'")
        self.spec = parsed
        self.ray = connect(parsed)
        self.lost = _lost_types(self.ray)
        self._actor_class = self.ray.remote(EnvWorker)
        self.replaced = 0  # idle proxies given a new actor at reset
        self.lost_workers = 0  # workers that died or did not answer (each an env_error of its episode)
        self._turn = -1  # the last node an actor was placed on (round robin)
        self._lock = threading.Lock()

    def new_actor(self, env_id: str, kwargs: dict[str, Any], unwrap: bool) -> Any:
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids)

        try:  # the driver's spec: ids registered here at run time (plugins, tests) work on the workers
            env: Any = gym.spec(env_id)
        except gym.error.Error as exc:
            raise ConfigError(f"{exc} (see `toolgym list`)") from exc
        opts: dict[str, Any] = {"scheduling_strategy": self._next_node()}
        if self.spec.num_cpus is not None:
            opts["num_cpus"] = self.spec.num_cpus
        if self.spec.resources:
            opts["resources"] = dict(self.spec.resources)
        return self._actor_class.options(**opts).remote(env, kwargs, unwrap)

    def _next_node(self) -> Any:
        """Round robin over the live nodes that can hold an env (CPUs, and ``spec.resources`` when given), as a
        soft affinity: a node that is gone falls back to any. (Ray's own ``SPREAD`` put actors made one after
        another on one node.)"""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        need = {"CPU": 0.0, **self.spec.resources}
        nodes = sorted(
            n["NodeID"]
            for n in self.ray.nodes()
            if n.get("Alive") and all(n.get("Resources", {}).get(k, 0.0) > 0 for k in need)
        )
        if not nodes:
            return "SPREAD"  # let Ray say why nothing fits
        with self._lock:
            self._turn += 1
            return NodeAffinitySchedulingStrategy(nodes[self._turn % len(nodes)], soft=True)

    def make(self, env_id: str, kwargs: dict[str, Any], unwrap: bool = False) -> RemoteEnv:
        return RemoteEnv(self, env_id, kwargs, unwrap)

    def env_factory(self) -> Callable[[Any], RemoteEnv]:
        """``EpisodeRunner``'s ``make_env``: an ``EpisodeSpec``'s env on a worker (stepped through its wrappers)."""
        return lambda spec: self.make(spec.env_id, dict(spec.kwargs), unwrap=False)


class RayTreeEnvs(TreeEnvs):
    """``TreeEnvs`` whose envs are ``RemoteEnv``s: a reset and a step are one hop each (the worker parses the
    turn, steps and snapshots); forks restore snapshots or replay actions through the proxy as in-process."""

    def __init__(self, env_kwargs: dict[str, Any], snapshots: bool, workers: RayEnvWorkers) -> None:
        super().__init__(env_kwargs, snapshots)
        self.workers = workers

    def stepper(self, env: Any, text: str) -> Callable[[], tuple[Any, ...]]:
        return lambda: env.step_text(text, self.snapshots)

    def _make(self, env_id: str) -> Any:
        env = self.workers.make(env_id, self.env_kwargs, unwrap=True)
        with self._lock:
            self._wrappers.append(env)
        return env


def tree_envs(env_kwargs: dict[str, Any], snapshots: bool, env_workers: str | RaySpec) -> TreeEnvs:
    """The tree rollout's envs for ``env_workers`` (``threads``: in this process; see ``parse_env_workers``; a
    ``RaySpec`` as it is: a run's ``env_call_timeout_s`` is in it)."""
    spec = env_workers if isinstance(env_workers, RaySpec) else parse_env_workers(env_workers)
    if spec is None:
        return TreeEnvs(env_kwargs, snapshots)
    return RayTreeEnvs(env_kwargs, snapshots, RayEnvWorkers(spec))


class LocalCluster:
    """A Ray cluster of ``nodes`` nodes on this machine (``ray start --block``: a head and workers, each with
    its own ports, temp dir and ``num_cpus``), for tests and benchmarks; ``stop`` (or leaving the ``with``)
    ends each ``ray start`` and its process group, by id. ``address`` is the ``env_workers`` value
    (``ray:127.0.0.1:PORT``); ``start_s`` how long the start took until every node was alive.

    ``env``: extra environment variables for the nodes (their workers inherit them, e.g. ``PYTHONPATH``
    for env classes that only the driver's path holds). ``start`` connects this process to the cluster (it
    waits for the nodes through it); ``stop`` disconnects it."""

    def __init__(self, nodes: int = 2, num_cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.nodes, self.num_cpus, self.extra_env = nodes, num_cpus, dict(env or {})
        self.procs: list[Any] = []
        self.dirs: list[str] = []
        self.logs: list[Any] = []
        self.address = ""
        self.client_address = ""
        self.start_s = 0.0

    def start(self) -> LocalCluster:
        import subprocess
        import tempfile

        t0 = time.perf_counter()
        gcs, client, *agents = _free_ports(2 + self.nodes)
        self.client_address = f"ray://127.0.0.1:{client}"  # the head's Ray Client server
        # the nodes' auth mode said, not left to Ray: with a token in ~/.ray/auth_token (from any earlier `ray
        # start` of token auth) `ray start` turned token auth on while this driver, RAY_AUTH_MODE unset, sent
        # none ("InvalidAuthToken"); a RAY_AUTH_MODE of the caller's applies to both
        auth = os.environ.get("RAY_AUTH_MODE", "disabled")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": auth, **self.extra_env}
        common = ["--block", "--num-cpus", str(self.num_cpus), "--disable-usage-stats",
                  "--object-store-memory", str(80 * 2**20), "--node-ip-address", "127.0.0.1"]  # fmt: skip
        try:
            for i in range(self.nodes):
                # short paths: Ray's unix sockets live under the temp dir (a socket path holds <= 107 bytes)
                self.dirs.append(tempfile.mkdtemp(prefix=f"rn{i}", dir="/tmp"))
                log = open(os.path.join(self.dirs[-1], "start.log"), "wb")  # noqa: SIM115 (closed in stop)
                self.logs.append(log)
                where = (["--head", "--port", str(gcs), "--ray-client-server-port", str(client),
                          "--include-dashboard", "false", "--temp-dir", self.dirs[-1]]
                         if i == 0 else ["--address", f"127.0.0.1:{gcs}"])  # fmt: skip
                cmd = ["ray", "start", *where, "--dashboard-agent-listen-port", str(agents[i]), *common]
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))  # fmt: skip
                if i == 0:
                    self._wait(lambda: _port_open(gcs), 90, "the head node's GCS")
            self.address = f"ray:127.0.0.1:{gcs}"
            ray = connect(RaySpec(address=f"127.0.0.1:{gcs}"))  # this process is the cluster's driver
            self._wait(
                lambda: sum(n["Alive"] for n in ray.nodes()) == self.nodes, 90, f"{self.nodes} live nodes"
            )
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def _wait(self, ok: Callable[[], bool], timeout: float, what: str) -> None:

        deadline = time.monotonic() + timeout
        while not ok():
            for p, log in zip(self.procs, self.logs, strict=False):
                if p.poll() is not None:
                    raise InfrastructureError(f"ray start exited ({p.returncode}): {_tail(log.name)}")
            if time.monotonic() > deadline:
                raise InfrastructureError(f"{what}: not up after {timeout} s: {_tail(self.logs[-1].name)}")
            time.sleep(0.2)

    def stop(self) -> None:
        import shutil
        import signal
        import subprocess

        if self.address:
            from ray import shutdown

            shutdown()  # the driver's connection first: its workers are the nodes' children
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # --block stops its node's processes on SIGTERM
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # whatever outlived it in its group
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.procs = []
        for f in self.logs:
            f.close()
        self.logs = []
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.dirs = []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-2000:]
    except OSError:
        return ""
