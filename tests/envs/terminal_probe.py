"""The probe task the Terminal-v0 trust and attack tests share: a Harbor folder whose root verifier runs
``test_sh``; the instruction asks for done in /app/done.txt."""

import json
from pathlib import Path

import gymnasium as gym

ID = "toolgym/Terminal-v0"
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


def shell(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "shell", "arguments": {"command": command}}) + "</tool_call>"


def probe_env(folder: Path, test_sh: str, verifier_timeout_s: float, command_timeout_s: float) -> gym.Env:
    """Terminal-v0 over one probe task written under ``folder``."""
    task = folder / "probe"
    for sub in ("environment", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Write done to /app/done.txt.\n")
    (task / "task.toml").write_text(f"[verifier]\ntimeout_sec = {verifier_timeout_s}\n")
    (task / "environment" / "Dockerfile").write_text("FROM toolgym-terminal:latest\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    return gym.make(ID, tasks=str(task), command_timeout_s=command_timeout_s)
