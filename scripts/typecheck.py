"""Type-check the repository as the `toolgym` package it installs as (what `make typecheck` runs).

    python scripts/typecheck.py           # mypy over every toolgym module
    python scripts/typecheck.py --pretty  # extra arguments go to mypy

Why a tree: setup.py maps top-level folders onto the namespace (``envs/`` is ``toolgym.envs``) through
``package_dir``, which mypy cannot read, and the editable install is an import hook mypy does not run. Checked
as plain folders, every ``import toolgym.envs...`` inside the repository was a missing module, so with
``ignore_missing_imports`` it typed as ``Any`` and hid errors. This script writes ``.typecheck/toolgym/``, a
tree of symlinks laid out as the installed package (rebuilt on every run, so a fresh clone or a new module
needs no step), runs ``mypy -p toolgym`` with that tree first on the search path, and prints the reported
paths as repository paths (``envs/cards.py``, not ``.typecheck/toolgym/envs/cards.py``).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# in .gitignore (so ruff skips it); pytest skips it because the name starts with "."
TREE = REPO / ".typecheck"
PACKAGE = "toolgym"


def package_roots() -> dict[str, str]:
    """setup.py's ROOTS (module name -> folder), read without running setup()."""
    module = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "ROOTS" for target in node.targets
        ):
            roots = ast.literal_eval(node.value)
            if isinstance(roots, dict):
                return {str(name): str(folder) for name, folder in roots.items()}
    raise SystemExit(
        "scripts/typecheck.py: setup.py has no literal ROOTS = {...} dict to read the layout from"
    )


def build_tree(roots: dict[str, str]) -> dict[str, str]:
    """Write the symlink tree; returns tree prefix -> repository prefix, for rewriting mypy's paths."""
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / PACKAGE
    top.mkdir(parents=True)
    rewrites: dict[str, str] = {}
    # The sub-packages first: a folder mapped to toolgym.X replaces whatever toolgym/ might hold at X.
    mapped: set[str] = set()
    for name, folder in roots.items():
        if name == PACKAGE or not (REPO / folder / "__init__.py").exists():
            continue  # the top package is linked entry by entry below; a part not in this checkout is skipped
        relative = name.removeprefix(PACKAGE + ".").replace(".", "/")
        link = top / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO / folder, target_is_directory=True)
        mapped.add(relative.split("/")[0])
        rewrites[f"{TREE.name}/{PACKAGE}/{relative}/"] = f"{folder}/"
    own = REPO / roots[PACKAGE]
    for entry in sorted(own.iterdir()):
        if entry.name in mapped or entry.name == "__pycache__":
            continue
        (top / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    rewrites[f"{TREE.name}/{PACKAGE}/"] = f"{roots[PACKAGE]}/"
    return rewrites


def main(argv: list[str]) -> int:
    rewrites = build_tree(package_roots())
    env = dict(os.environ)
    # MYPYPATH comes before the current directory in mypy's search order, so `toolgym` is the tree, not the
    # repository's toolgym/ folder (which lacks the mapped sub-packages).
    env["MYPYPATH"] = os.pathsep.join(filter(None, [TREE.name, env.get("MYPYPATH", "")]))
    command = [sys.executable, "-m", "mypy", "-p", PACKAGE, *argv]
    # Longest prefix first: .typecheck/toolgym/envs/ before .typecheck/toolgym/.
    ordered = sorted(rewrites.items(), key=lambda item: -len(item[0]))
    # Streamed line by line: a cold run (no .mypy_cache) takes minutes.
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as mypy:
        assert mypy.stdout is not None  # stdout=PIPE
        for line in mypy.stdout:
            for tree_prefix, repo_prefix in ordered:
                line = line.replace(tree_prefix, repo_prefix)
            sys.stdout.write(line)
            sys.stdout.flush()
    return mypy.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
