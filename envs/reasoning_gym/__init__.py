"""reasoning-gym's procedurally generated reasoning tasks (PyPI ``reasoning-gym``) as toolgym envs.

One id per dataset of reasoning-gym's registry that passes toolgym's env checks
(``toolgym/ReasoningGym-<task>-v0``), plus ``toolgym/ReasoningGym-v0`` that plays any dataset by name
(``task=``), a newer version's too. The ids come from the shipped catalog (``catalog.tsv``, written by
``python -m toolgym.envs.reasoning_gym.catalog`` from reasoning-gym's registry, with each task's check
result): reading it imports nothing, so ``import toolgym`` stays cheap with or without reasoning-gym.
"""

from pathlib import Path

CATALOG_FILE = Path(__file__).with_name("catalog.tsv")
# status: the short check's result ("ok", "ok-no-gold" or "fail:WHICH"); full: `toolgym check`'s own settings
CATALOG_COLUMNS = ("task", "category", "status", "seconds", "description", "note", "full")


def read_catalog() -> list[dict[str, str]]:
    """The shipped catalog: one row per reasoning-gym dataset, with its check status ("ok" or what failed)."""
    if not CATALOG_FILE.exists():
        return []
    rows = []
    for line in CATALOG_FILE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith(("#", "task\t")):
            continue
        cells = line.split("\t")
        rows.append(
            dict(
                zip(
                    CATALOG_COLUMNS,
                    (cells + [""] * len(CATALOG_COLUMNS))[: len(CATALOG_COLUMNS)],
                    strict=True,
                )
            )
        )
    return rows


WORKING = ("ok", "ok-no-gold")  # "ok-no-gold": the dataset has no gold answer, so no expert (declared 0)


def working_tasks() -> list[str]:
    """The datasets that passed the checks: each gets an id of its own."""
    return [row["task"] for row in read_catalog() if row["status"] in WORKING]


def class_name(task: str) -> str:
    """``chain_sum`` -> ``ReasoningGym_chain_sum`` (the class ``env.py`` makes for that id)."""
    return "ReasoningGym_" + task


def env_id(task: str) -> str:
    return f"toolgym/ReasoningGym-{task}-v0"


ENVS = {"toolgym/ReasoningGym-v0": "toolgym.envs.reasoning_gym.env:ReasoningGymEnv"}
ENVS.update({env_id(task): f"toolgym.envs.reasoning_gym.env:{class_name(task)}" for task in working_tasks()})
