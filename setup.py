"""Maps the repository's top-level folders onto the `toolgym` namespace (see docs/architecture.md)."""

import os

from setuptools import find_packages, setup

ROOTS = {
    "toolgym": "toolgym",
    "toolgym.envs": "envs",
    "toolgym.sandboxes": "sandboxes",
    "toolgym.rewards": "rewards",
    "toolgym.agents": "agents",
    "toolgym.trainers": "trainers",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, folder in ROOTS.items():
    if not os.path.exists(os.path.join(folder, "__init__.py")):
        continue  # a part not in this checkout
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
