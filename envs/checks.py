"""toolgym's env checks, run over every registered id (``toolgym check`` and tests/envs/test_all_envs.py).

1. gymnasium's ``check_env`` (API, spaces, seeding);
2. seeded determinism: same seed → same task, and the same transcript for the same actions (an env that
   declares ``deterministic = False`` in its card, a page on the wall clock, skips it);
3. random garbage actions are handled without an exception, each flagged ``invalid_action`` with feedback;
4. the scripted expert's success rate is at least the rate the env declares;
5. forking: an episode restored with ``set_state`` in a fresh env continues exactly as the original (envs
   with ``supports_fork``), so a per-episode field that ``get_state`` forgets shows up here, not in training.

An id whose optional package is missing (``DependencyNotInstalled``) is not failed but ``skipped``: the report
says what to install, and ``toolgym check`` without ids lists it in one line.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import DependencyNotInstalled

from toolgym.envs.base import tool_env


@dataclass
class CheckReport:
    env_id: str
    passed: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    expert_success: float = float("nan")
    declared_success: float = float("nan")
    seconds: float = 0.0
    # why the checks did not run: an optional package the env needs is missing (the install command)
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.skipped and all(self.passed.values())


def _run_check(report: CheckReport, name: str, fn: Any) -> None:
    try:
        fn()
        report.passed[name] = True
    except DependencyNotInstalled as exc:  # not the env's fault: the caller may skip the id
        report.passed[name] = False
        report.skipped = str(exc)
        report.errors[name] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a check failing is a result to report, not a crash
        report.passed[name] = False
        report.errors[name] = f"{type(exc).__name__}: {exc}"


def _gym_check_env(env_id: str) -> None:
    from gymnasium.utils.env_checker import check_env

    env = gym.make(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


# An episode that ended in an infrastructure error (``info["infra_error"]``: a sandbox that did not start under
# load, a host out of memory) says nothing of the property a check is about (determinism, forks, the expert):
# it is played again, up to this many times in all, with a warning; one that never ends cleanly fails the check
# naming the error, never as a difference of the env's
TRIES = 3


def _infra(infos: list[dict[str, Any]]) -> str | None:
    return next((str(i["infra_error"]) for i in infos if i.get("infra_error")), None)


def _retried(env_id: str, what: str, play: Any) -> Any:
    """``play()`` (a result and the infos of its steps) until no step had an infrastructure error."""
    error = None
    for _ in range(TRIES):
        result, infos = play()
        error = _infra(infos)
        if error is None:
            return result
        warnings.warn(f"{env_id}: {what}: an infrastructure error, played again: {error:.300}", stacklevel=2)
    raise AssertionError(f"{what}: an infrastructure error in each of {TRIES} tries: {error:.500}")


def _replay(env: Any, seed: int, actions: list[Any]) -> tuple[Any, list[Any]]:
    env.reset(seed=seed)
    steps = []
    for action in actions:
        step = env.step(action)
        steps.append(step)
        if step[2] or step[3]:
            break
    return tool_env(env).transcript, steps


def _clean_replay(env_id: str, env: Any, seed: int, actions: list[Any]) -> tuple[Any, list[Any]]:
    def play() -> tuple[tuple[Any, list[Any]], list[dict[str, Any]]]:
        got = _replay(env, seed, actions)
        return got, [step[4] for step in got[1]]

    return _retried(env_id, f"seed {seed}", play)


# a turn that is no action in the tool formats (a command in the command format): forks are checked after it
# too, so a family's count of such turns (void turns, invalid actions) must survive a fork
FORK_OPENING = "I am not sure yet."


def _play_expert(env: Any, seed: int, opening: tuple[str, ...] = ()) -> tuple[list[str], dict[str, Any]]:
    """One episode of the scripted expert, after the ``opening`` actions: all the actions and the last
    step's info."""
    env.reset(seed=seed)
    inner = tool_env(env)
    actions: list[str] = []
    info: dict[str, Any] = {}
    for turn in range(inner.max_turns):
        actions.append(opening[turn] if turn < len(opening) else inner.expert_action())
        _, _, term, trunc, info = env.step(actions[-1])
        if term or trunc:
            break
    return actions, info


def _clean_expert(
    env_id: str, env: Any, seed: int, opening: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, Any]]:
    """``_play_expert`` played again while it ends in an infrastructure error (``TRIES``)."""

    def play() -> tuple[tuple[list[str], dict[str, Any]], list[dict[str, Any]]]:
        got = _play_expert(env, seed, opening)
        return got, [got[1]]

    return _retried(env_id, f"the expert's episode of seed {seed}", play)


def _first_difference(first: tuple[Any, list[Any]], second: tuple[Any, list[Any]]) -> str:
    """Where two replays part (the first differing step, else transcript message), both sides cut: what a
    report needs to tell a flaky tool from a seed that does not fix the task."""
    for label, a, b in (("step", first[1], second[1]), ("transcript message", first[0], second[0])):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"{label} {i}: {x!r:.400} != {y!r:.400}"
        if len(a) != len(b):
            return f"{label}s: {len(a)} != {len(b)}"
    return "?"


def _determinism(env_id: str, seeds: int = 5) -> None:
    env = gym.make(env_id)
    try:
        if not getattr(tool_env(env), "deterministic", True):
            return  # declared in its card (a page on the wall clock): nothing to replay
        for seed in range(seeds):
            actions, _ = _clean_expert(env_id, env, seed)
            first = _clean_replay(env_id, env, seed, actions)
            second = _clean_replay(env_id, env, seed, actions)
            if first != second:
                raise AssertionError(
                    f"seed {seed}: two runs of the same actions differ: {_first_difference(first, second)}"
                )
        a = env.reset(seed=1)[0]
        b = env.reset(seed=2)[0]
        c = env.reset(seed=1)[0]
        if a != c:
            raise AssertionError("reset(seed=1) twice gave different tasks")
        if a == b:
            warnings.warn(f"{env_id}: seeds 1 and 2 gave the same task", stacklevel=2)
    finally:
        env.close()


def _garbage(env_id: str, n: int = 200, seed: int = 0) -> None:
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    space = env.action_space
    space.seed(seed)
    extra: list[Any] = [
        "",
        "<tool_call>",
        "<tool_call>{}</tool_call>",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>',
        "<answer>1</answer><answer>2</answer>",
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "x", "function": {"name": "zz", "arguments": "{"}}],
        },
        "\x00" * 10,
        "<think>" + "a" * 1000,
        12345,
        None,
    ]
    try:
        env.reset(seed=seed)
        for i in range(n):
            action = extra[i] if i < len(extra) else space.sample()
            if rng.random() < 0.02:
                action = str(action) * 50
            obs, _, term, trunc, info = env.step(action)
            if not env.observation_space.contains(obs):
                raise AssertionError(f"observation outside the space after action {action!r:.80}")
            if info["invalid_action"] and not obs and not (term or trunc):
                raise AssertionError(f"invalid action {action!r:.80} gave no feedback")
            if term or trunc:
                env.reset(seed=seed + i + 1)
    finally:
        env.close()


def _fork(env_id: str, seeds: int = 3, cuts: int = 5) -> None:
    """Fork expert episodes (each opened by one turn that is no action) into a second, fresh env at up to
    ``cuts`` turns (the first ones, where most state is created, and spread over the rest); both must
    continue identically: observations, rewards, ends and infos."""
    original, copy_env = gym.make(env_id), gym.make(env_id)
    try:
        if not tool_env(original).supports_fork:
            return
        for seed in range(seeds):
            actions, _ = _clean_expert(env_id, original, 2000 + seed, (FORK_OPENING,))
            n = len(actions)
            chosen = sorted(
                {0, 1, *np.linspace(0, n - 1, num=max(cuts - 2, 1), dtype=int).tolist()} & set(range(n))
            )
            for cut in chosen:
                at = (original, copy_env, 2000 + seed, actions, cut)
                problem = _retried(env_id, f"seed {seed}, a fork at turn {cut}", lambda at=at: _fork_at(*at))
                if problem is not None:
                    raise AssertionError(f"seed {seed}: a fork at turn {cut} {problem}")
    finally:
        original.close()
        copy_env.close()


def _fork_at(
    original: Any, copy_env: Any, seed: int, actions: list[str], cut: int
) -> tuple[str | None, list[dict[str, Any]]]:
    """The episode of ``seed`` forked into ``copy_env`` after ``actions[:cut]``, both sides played to the end:
    the first difference (None: none), and every step's info."""
    infos: list[dict[str, Any]] = []
    original.reset(seed=seed)
    for action in actions[:cut]:
        infos.append(original.step(action)[4])
    state = tool_env(original).get_state()
    copy_env.reset(seed=9999)  # a different episode first: leftovers must not survive set_state
    tool_env(copy_env).set_state(state)
    for action in actions[cut:]:
        a, b = original.step(action), copy_env.step(action)
        infos += [a[4], b[4]]
        if a != b:
            return f"diverged at action {action!r:.80}: {a!r:.300} != {b!r:.300}", infos
    if tool_env(original).transcript != tool_env(copy_env).transcript:
        return "ended with another transcript", infos
    return None, infos


def expert_success_rate(
    env_id: str, episodes: int = 20, failures: list[str] | None = None, **kwargs: Any
) -> float:
    """The scripted expert's success rate over seeds 1000…; each lost episode is described in ``failures``."""
    env = gym.make(env_id, **kwargs)
    wins = 0
    try:
        for seed in range(episodes):
            for _ in range(TRIES):  # (an infrastructure error each time: a lost episode, described below)
                _, info = _play_expert(env, 1000 + seed)
                if not info.get("infra_error"):
                    break
                warnings.warn(
                    f"{env_id}: seed {1000 + seed}: an infrastructure error, played again", stacklevel=2
                )
            wins += bool(info.get("success"))
            if not info.get("success") and failures is not None:  # what a flake needs to diagnose itself
                keys = ("task_name", "truncation", "infra_error", "reward_components", "verifier_output")
                said = {k: info[k] for k in keys if k in info}
                last = tool_env(env).transcript[-4:]  # (messages, or their dicts)
                said["last"] = [str(m["content"] if isinstance(m, dict) else m.content)[-300:] for m in last]
                failures.append(f"seed {1000 + seed}: {said!r:.2500}")
    finally:
        env.close()
    return wins / episodes


def check(env_id: str, garbage_actions: int = 200, expert_episodes: int = 20) -> CheckReport:
    """Run every check on one id and return a report (never raises for a failing check)."""
    report = CheckReport(env_id)
    start = time.perf_counter()
    _run_check(report, "gymnasium", lambda: _gym_check_env(env_id))
    if report.skipped:  # every other check would fail the same way
        report.seconds = time.perf_counter() - start
        return report
    try:
        declared, cap = _declared(env_id)  # once: class-level settings, read from one instance
    except Exception:  # the gymnasium check reports why the env cannot be made
        declared, cap = float("nan"), None
    small = min(5, cap) if cap else 5  # slow envs (a JVM) replay fewer expert episodes
    _run_check(report, "determinism", lambda: _determinism(env_id, seeds=small))
    _run_check(report, "garbage", lambda: _garbage(env_id, garbage_actions))
    _run_check(report, "fork", lambda: _fork(env_id, seeds=min(3, small)))
    from toolgym.vector import check_vector  # make_vec over the id: two envs, SAME_STEP autoreset

    _run_check(report, "vector", lambda: check_vector(env_id))

    def expert() -> None:
        report.declared_success = declared
        failures: list[str] = []
        episodes = min(expert_episodes, cap or expert_episodes)
        report.expert_success = expert_success_rate(env_id, episodes, failures)
        if not report.expert_success >= report.declared_success:
            raise AssertionError(
                f"expert success {report.expert_success:.2f} < declared {report.declared_success:.2f}; "
                + "; ".join(failures)
            )

    _run_check(report, "expert", expert)
    report.seconds = time.perf_counter() - start
    return report


def _declared(env_id: str) -> tuple[float, int | None]:
    """The success rate the env declares, and its cap on expert episodes in the checks (slow engines)."""
    env = gym.make(env_id)
    try:
        inner = tool_env(env)
        return float(inner.expert_success_rate), inner.check_expert_episodes
    finally:
        env.close()
