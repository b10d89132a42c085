"""``toolgym info ID`` prints an env's card, and the README's env table is the one the cards give."""

from pathlib import Path

from tests.script_modules import load_script
from toolgym.cli import main
from toolgym.envs.cards import build_card, render_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_info_prints_the_card(capsys):
    assert main(["info", "toolgym/Calculator-v0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toolgym/Calculator-v0  (math; from toolgym)")
    for part in (
        "calculator: Evaluate an arithmetic expression exactly.",
        "reward components: correct, format, tool",
        "action formats: hermes, tags, message",
        "  digits = 2",
        "expert success: 1.00 (declared)",
        "example episode (expert, seed 0):",
        "[tool calculator]",
    ):
        assert part in out, part


def test_info_measures_the_expert_and_renders_markdown(capsys):
    assert main(["info", "toolgym/Household-v0", "--measure", "2", "--markdown", "--no-example"]) == 0
    out = capsys.readouterr().out
    assert "| tools | none (commands) |" in out
    assert "| expert success | 1.00 (measured over 2 episodes (declared 1.00)) |" in out
    assert "Example episode" not in out


def test_info_unknown_id_is_a_clear_error(capsys):
    assert main(["info", "toolgym/Nope-v0"]) == 2
    assert "unknown env id 'toolgym/Nope-v0'" in capsys.readouterr().err


def test_card_is_static_without_example():
    card = build_card("toolgym/Calculator-v0")
    assert card.example == [] and card.expert_source == "declared"
    assert ("digits", "2") in card.knobs
    assert "| family | math |" in render_markdown(card)


def test_readme_env_table_is_current():
    env_table = load_script("scripts/env_table.py")
    assert env_table.main(["--check"]) == 0, "README.md's env table is stale: python scripts/env_table.py"
