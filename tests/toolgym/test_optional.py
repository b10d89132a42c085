"""Each optional import, with its package hidden, raises gymnasium's DependencyNotInstalled naming the extra
that installs it (``sys.modules[name] = None`` makes Python's import fail as if the package were absent)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gymnasium.error import DependencyNotInstalled

import toolgym  # noqa: F401  (registers the envs)
from tests.processes import run
from toolgym.optional import require


def _hide(monkeypatch: pytest.MonkeyPatch, top: str) -> None:
    """Make ``top`` and every submodule of it unimportable for this test (a submodule already imported would
    otherwise be found in sys.modules without its parent)."""
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")] or [top]:
        monkeypatch.setitem(sys.modules, name, None)


def _math_pool(tmp: Path) -> Any:
    from toolgym.rewards.math_pool import MathJudgePool

    return MathJudgePool(workers=1)


def _docker_client(tmp: Path) -> Any:
    from toolgym.sandboxes.docker_backend import client

    return client.__wrapped__()  # past the cache: the test process may hold a client already


def _docker_ulimits(tmp: Path) -> Any:
    from toolgym.sandboxes.docker_backend import container_kwargs
    from toolgym.sandboxes.limits import Limits

    return container_kwargs(Limits(), "toolgym-test")


def _lora(tmp: Path) -> Any:
    import torch

    from toolgym.trainers.config import RunConfig
    from toolgym.trainers.modeling import build_policy

    return build_policy(RunConfig(lora_r=4), torch.device("cpu"), model=torch.nn.Linear(2, 2), tokenizer=None)


def _parquet_questions(tmp: Path) -> Any:
    from toolgym.envs.search.corpus import load_questions

    (tmp / "q.parquet").write_bytes(b"")
    return load_questions(tmp / "q.parquet")


def _corpus_progress(tmp: Path) -> Any:
    from toolgym.envs.search.corpus import write_world_jsonl

    return write_world_jsonl(None, tmp / "corpus.jsonl")  # type: ignore[arg-type]  (fails before reading it)


def _hub_dataset(tmp: Path) -> Any:
    from toolgym.envs.python_math.datasets import load_rows

    return load_rows("someone/some-math-set")


def _mcp_client(tmp: Path) -> Any:
    from toolgym.envs.mcp.client import MCPClient, ServerConfig

    return MCPClient(ServerConfig(command=["true"]))


def _curriculum(tmp: Path) -> Any:
    from toolgym.trainers.curriculum import reasoning_gym_levels

    return reasoning_gym_levels("toolgym/ReasoningGym-v0", {"task": "gcd"})


def _retrieval_app(tmp: Path) -> Any:
    from toolgym.envs.search.retrieval_server import create_app

    return create_app(None)  # type: ignore[arg-type]


def _reward_app(tmp: Path) -> Any:
    from toolgym.serving.reward_server import build_reward_app

    return build_reward_app(None)  # type: ignore[arg-type]


def _policy_app(tmp: Path) -> Any:
    from toolgym.agents.openai_server import build_app

    return build_app(None)  # type: ignore[arg-type]


def _trl_tokenizer(tmp: Path) -> Any:
    from toolgym.adapters.trl import tool_tokenizer

    return tool_tokenizer()


def _trl_dataset(tmp: Path) -> Any:
    from toolgym.adapters.trl import dataset

    return dataset("toolgym/PythonMath-v0", 1)


def _hf_model(tmp: Path) -> Any:
    from toolgym.agents.hf import load_model

    return load_model("smollm2-135m")


def _yaml_config(tmp: Path) -> Any:
    from toolgym.trainers.config import load_yaml

    (tmp / "c.yaml").write_text("lr: 1\n")
    return load_yaml(tmp / "c.yaml")


def _export(tmp: Path) -> Any:
    from toolgym.cli.run_models import _export

    return _export(tmp, tmp / "weights.pt", tmp / "out")


# (the module under test, the package hidden, what reaches the import, the extra the error names)
CASES: list[tuple[str, str, Callable[[Path], Any], str]] = [
    ("toolgym.rewards.math_pool", "math_verify", _math_pool, "rewards"),
    ("toolgym.sandboxes.docker_backend", "docker", _docker_client, "docker"),
    ("toolgym.sandboxes.docker_backend", "docker", _docker_ulimits, "docker"),
    ("toolgym.trainers.modeling", "peft", _lora, "train"),
    ("toolgym.envs.search.corpus", "pyarrow", _parquet_questions, "search"),
    ("toolgym.envs.search.corpus", "tqdm", _corpus_progress, "search"),
    ("toolgym.envs.python_math.datasets", "datasets", _hub_dataset, "train"),
    ("toolgym.envs.mcp.client", "mcp", _mcp_client, "mcp"),
    ("toolgym.trainers.curriculum", "reasoning_gym", _curriculum, "interop"),
    ("toolgym.envs.search.retrieval_server", "fastapi", _retrieval_app, "search"),
    ("toolgym.serving.reward_server", "fastapi", _reward_app, "interop"),
    ("toolgym.agents.openai_server", "fastapi", _policy_app, "interop"),
    ("toolgym.adapters.trl", "transformers", _trl_tokenizer, "train"),
    ("toolgym.adapters.trl", "datasets", _trl_dataset, "train"),
    ("toolgym.agents.hf", "torch", _hf_model, "train"),
    ("toolgym.trainers.config", "yaml", _yaml_config, "train"),
    ("toolgym.cli.run_models", "torch", _export, "train"),
]


@pytest.mark.parametrize(("module", "hidden", "call", "extra"), CASES, ids=[c[2].__name__[1:] for c in CASES])
def test_missing_package_names_its_extra(
    module: str,
    hidden: str,
    call: Callable[[Path], Any],
    extra: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    importlib.import_module(module)  # with its module-level imports, while they are visible
    _hide(monkeypatch, hidden)
    with pytest.raises(DependencyNotInstalled, match=rf"pip install 'toolgym\[{extra}\]'"):
        call(tmp_path)


def test_docker_problem_says_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolgym.sandboxes.docker_backend import docker_problem

    _hide(monkeypatch, "docker")
    assert docker_problem("toolgym-sandbox") == "docker is not installed: pip install 'toolgym[docker]'"


def test_tomli_without_an_extra_says_pip_install_tomli(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python 3.10 reads task.toml with tomli, which no extra holds
    _hide(monkeypatch, "tomli")
    with pytest.raises(
        DependencyNotInstalled, match=r"tomli is not installed \(reading task.toml.*pip install tomli$"
    ):
        require("tomli", why="reading task.toml on Python 3.10")


BM25S_WITH_JAX = """
import sys
from toolgym.optional import require
require("bm25s")
import bm25s.selection
assert "jax" not in sys.modules, "bm25s brought jax in"
assert not bm25s.selection.JAX_IS_AVAILABLE
import jax  # the import system forgot the mark: the process's own jax is as it was
assert jax.STARTED
print("ok")
"""


def test_bm25s_does_not_start_jax(tmp_path: Path) -> None:
    # bm25s runs a jax top-k at import where jax is installed: on a GPU machine that takes 75% of a GPU's memory
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("STARTED = True\n")
    (fake / "lax.py").write_text("raise SystemExit('jax.lax imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = run([sys.executable, "-c", BM25S_WITH_JAX], timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
