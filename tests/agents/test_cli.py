"""``toolgym eval``: scoreboard, JSONL, and an HTML report that renders in Chromium."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from toolgym.agents import Trajectory, load_trajectories
from toolgym.agents.report import render_report
from toolgym.cli import main


def test_eval_scripted_prints_scoreboard_and_writes_files(tmp_path: Path, capsys: Any) -> None:
    code = main(
        ["eval", "toolgym/Calculator-v0", "--agent", "scripted", "--episodes", "4", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "toolgym/Calculator-v0  4         100.0%   1.000   2.00   1.00" in out
    trajs = load_trajectories(tmp_path / "trajectories.jsonl")
    assert len(trajs) == 4 and all(t.success for t in trajs)
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and html.count("<details>") == 4 and "calculator" in html


def test_eval_bad_arguments_say_what_to_do(capsys: Any) -> None:
    assert main(["eval", "toolgym/Calculator-v0", "--agent", "gpt", "--episodes", "1"]) == 2
    assert "unknown agent 'gpt'" in capsys.readouterr().err
    assert main(["eval", "Nope", "--agent", "scripted"]) == 2


def test_report_escapes_model_text() -> None:
    t = Trajectory(
        env_id="e", seed=0, messages=[{"role": "assistant", "content": "<script>alert(1)</script>"}]
    )
    html = render_report([t])
    assert "<script>" not in html and "&lt;script&gt;" in html


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_html_report_renders_in_chromium(tmp_path: Path) -> None:
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    assert (
        main(
            [
                "eval",
                "toolgym/Calculator-v0",
                "--agent",
                "scripted",
                "--episodes",
                "3",
                "--out",
                str(tmp_path),
                "--quiet",
            ]
        )
        == 0
    )
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto((tmp_path / "report.html").as_uri())
            assert page.title() == "toolgym eval"
            assert page.locator("#scoreboard tr").count() == 2
            assert page.locator("details").count() == 3
            bar = page.locator("svg rect.bar").first.bounding_box()
            assert bar is not None and bar["width"] > 100  # 100% success: a full-width bar
            page.locator("details summary").first.click()
            assert page.locator("details .msg.tool").first.is_visible()
            shot = page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert len(shot) > 10_000 and (tmp_path / "report.png").stat().st_size > 10_000


def _tiny_model_folder(folder: Path) -> Any:
    """A tiny random Llama with SmolLM2's template shape, saved as a transformers folder."""
    from tests.agents.conftest import CHATML, make_tokenizer, tiny_model

    tokenizer = make_tokenizer(CHATML)
    model = tiny_model(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_eval_loads_the_model_a_train_run_saved(tmp_path: Path, capsys: Any) -> None:
    """``--agent hf:RUN_DIR`` on a GRPO run: its checkpoint's weights over the model it started from (an SFT
    run's folder, as `make demo` does), exported once into RUN_DIR/model; an SFT run's model is read as is."""
    import json

    import torch

    from toolgym.trainers import checkpoint

    sft = tmp_path / "demo_sft"
    base = _tiny_model_folder(sft / "model")
    run = tmp_path / "demo_rl"
    run.mkdir()
    trained = type(base).from_pretrained(sft / "model")
    with torch.no_grad():
        trained.lm_head.weight.mul_(2.0)  # "training": weights the starting model does not have
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    checkpoint.save(run / "checkpoint", {"model": trained}, optimizer, checkpoint.Progress(step=10))
    settings = {
        "algorithm": "grpo",
        "model": str(sft / "model"),
        "lora_r": 0,
        "env_kwargs": {"prompt_format": "text", "action_format": "tags", "split": "train", "max_turns": 2},
        "eval_env_kwargs": {"split": "test"},
    }
    (run / "config.json").write_text(json.dumps(settings))

    argv = ["eval", "toolgym/Calculator-v0", "--episodes", "2", "--max-new-tokens", "4", "--quiet"]
    for agent in (f"hf:{run}", f"hf:{sft}"):
        assert main([*argv, "--agent", agent, "--no-report", "--out", str(tmp_path / "eval")]) == 0
        out = capsys.readouterr()
        assert "toolgym/Calculator-v0  2" in out.out
        if agent == f"hf:{run}":  # the settings the run evaluated on: its eval split over its training one
            assert "'action_format': 'tags', 'split': 'test', 'max_turns': 2}" in out.err
    exported = type(base).from_pretrained(run / "model")
    assert torch.equal(exported.lm_head.weight, trained.lm_head.weight)
    assert not torch.equal(exported.lm_head.weight, base.lm_head.weight)
    assert (run / "model" / "tokenizer_config.json").is_file()
