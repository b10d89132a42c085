"""The web family: real MiniWoB++ tasks in a real Chromium (Playwright), one id per task plus Web-v0."""

from pathlib import Path

TASKS_FILE = Path(__file__).with_name("miniwob_tasks.txt")


def miniwob_tasks() -> list[str]:
    """The MiniWoB++ task names playable in text mode (the shipped list; nothing is imported)."""
    lines = TASKS_FILE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def class_name(task: str) -> str:
    """``click-button`` -> ``MiniWoB_click_button`` (the class ``env.py`` makes for that id)."""
    return "MiniWoB_" + task.replace("-", "_")


ENVS = {"toolgym/Web-v0": "toolgym.envs.web.env:WebEnv"}
ENVS.update(
    {f"toolgym/MiniWoB-{task}-v0": f"toolgym.envs.web.env:{class_name(task)}" for task in miniwob_tasks()}
)
