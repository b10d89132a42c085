"""Typed errors raised at toolgym's boundaries. Each message says what was wrong and what to do."""

from gymnasium.error import DependencyNotInstalled as GymDependencyNotInstalled


class ToolgymError(Exception):
    """Base class of every error toolgym raises on purpose."""


class ConfigError(ToolgymError, ValueError):
    """A setting, file or model name is wrong; the message names it and the accepted values."""


class InfrastructureError(ToolgymError, RuntimeError):
    """A sandbox, browser or env fault: not the model's failure, never scored as one."""


class EpisodeOverError(ToolgymError, RuntimeError):
    """`step` was called after the episode ended; call `reset` first."""


class EnvStateError(ToolgymError, TypeError):
    """An env that forks set an attribute of itself during an episode (a fork would lose it): the env's
    author keeps that data in the object `new_episode()` returns instead."""


class DependencyNotInstalled(ToolgymError, ImportError, GymDependencyNotInstalled):
    """An optional package is missing; the message names it and the command that installs it (gymnasium's
    own class too, so code written for gymnasium's envs catches it). Raise it through toolgym.optional."""

    def __init__(
        self, package: str, extra: str | None = None, *, why: str = "", install: str | None = None
    ) -> None:
        how = install or (f"pip install 'toolgym[{extra}]'" if extra else f"pip install {package}")
        reason = f" ({why})" if why else ""
        super().__init__(f"{package} is not installed{reason}: {how}")
        self.name = package
        self.install = how
