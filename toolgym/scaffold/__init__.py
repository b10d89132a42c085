"""``toolgym new NAME``: a third-party env package that plugs into toolgym through the ``toolgym.envs``
entry point group: an env with one tool, seeded tasks, a scripted expert, tests that run toolgym's env
checks, and a README whose card comes from ``toolgym info``.

The templates are the ``*.tmpl`` files beside this module (package data); ``{{key}}`` marks a value.
"""

from __future__ import annotations

import importlib
import re
import sys
from importlib import resources
from pathlib import Path

from toolgym.errors import ConfigError

# template file -> path in the new package ({module} is the import name)
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "init.py.tmpl": "{module}/__init__.py",
    "env.py.tmpl": "{module}/env.py",
    "tasks.py.tmpl": "{module}/tasks.py",
    "expert.py.tmpl": "{module}/expert.py",
    "test_env.py.tmpl": "tests/test_env.py",
}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def names(name: str) -> dict[str, str]:
    """The names a package called ``name`` uses: distribution, module, env class and id.

    >>> names("letter-count")["id"], names("letter-count")["cls"]
    ('letter_count/LetterCount-v0', 'LetterCountEnv')
    """
    if not _NAME.match(name):
        raise ConfigError(
            f"NAME must start with a letter and hold only letters, digits, - and _; got {name!r}"
        )
    module = re.sub(r"[-]+", "_", name).lower()
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[-_]+", name) if part)
    return {
        "name": name,
        "dist": name.lower(),
        "module": module,
        "cls": f"{camel}Env",
        "id": f"{module}/{camel}-v0",
    }


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def scaffold(name: str, directory: str | Path | None = None) -> Path:
    """Write the package for ``name`` into ``directory`` (default ``./NAME``), which must not exist or be
    empty; returns it. The README's card is rendered from the new env class itself."""
    values = names(name)
    root = Path(directory) if directory is not None else Path(name)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"{root} already exists and is not an empty folder")
    templates = resources.files(__name__)
    for template, target in FILES.items():
        if template == "README.md.tmpl":
            continue
        path = root / target.format(module=values["module"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            _fill(templates.joinpath(template).read_text(encoding="utf-8"), values), encoding="utf-8"
        )
    values["card"] = _card(root, values)
    readme = _fill(templates.joinpath("README.md.tmpl").read_text(encoding="utf-8"), values)
    (root / "README.md").write_text(readme, encoding="utf-8")
    return root


def _card(root: Path, values: dict[str, str]) -> str:
    """The new env's card (markdown), from its class loaded straight from ``root`` (not installed yet)."""
    from toolgym.envs.cards import build_card, render_markdown

    module = values["module"]
    sys.path.insert(0, str(root.resolve()))
    try:
        cls = getattr(importlib.import_module(f"{module}.env"), values["cls"])
        return render_markdown(build_card(values["id"], cls=cls, origin=values["dist"], example=True))
    finally:
        sys.path.remove(str(root.resolve()))
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[loaded]
