"""Typed errors raised at toolgym's boundaries. Each message says what was wrong and what to do."""


class ToolgymError(Exception):
    """Base class of every error toolgym raises on purpose."""


class ConfigError(ToolgymError, ValueError):
    """A setting, file or model name is wrong; the message names it and the accepted values."""


class InfrastructureError(ToolgymError, RuntimeError):
    """A sandbox, browser or env fault: not the model's failure, never scored as one."""


class EpisodeOverError(ToolgymError, RuntimeError):
    """`step` was called after the episode ended; call `reset` first."""
