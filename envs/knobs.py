"""The keyword arguments ("knobs") of an env class: which it accepts over its class hierarchy, and the
check that turns a misspelt one into a ConfigError listing them (``ToolEnv`` wraps every subclass's
``__init__`` with it; env cards read the defaults)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from toolgym.errors import ConfigError


@functools.cache
def knob_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Every keyword argument an env class accepts, over its whole class hierarchy, each as the first
    ``__init__`` in MRO order declares it (so a subclass's default wins)."""
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        init = getattr(init, "__wrapped__", init)
        for p in inspect.signature(init).parameters.values():
            if (
                p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name != "self"
                and p.name not in found
            ):
                found[p.name] = p
    return found


def knobs(cls: type) -> tuple[str, ...]:
    """Every keyword argument an env class accepts, over its whole class hierarchy."""
    return tuple(knob_parameters(cls))


def knob_checked(init: Callable[..., None]) -> Callable[..., None]:
    """A typo in an env kwarg is a ConfigError that lists the accepted knobs, not a bare TypeError."""

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        accepted = knobs(type(self))  # type: ignore[arg-type]
        unknown = sorted(k for k in kwargs if k not in accepted)
        if unknown and not getattr(self, "accepts_any_kwargs", False):
            raise ConfigError(
                f"{type(self).__name__} got unknown argument(s) {unknown}; accepted: {', '.join(accepted)}"
            )
        init(self, *args, **kwargs)

    return checked
