"""``toolgym view``: rollout trees saved by the trainer's ``saved_rollouts`` become one HTML page, checked in a real
Chromium (Playwright): it renders offline, shows branch points, tool calls and advantages, and filters."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests import processes
from toolgym.errors import ConfigError
from toolgym.trainers.saved_rollouts import save_step
from toolgym.trainers.tree import RolloutTree, flatten
from toolgym.viewer import pick_steps, write_view

CALC = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*58"}}</tool_call>'
# a tool result as a ChatML model's tokens decode: the end of the model's turn, the result's turn, the next prompt
RESULT = (
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n2146\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(token_ids: list[int]) -> str:
    return "".join(chr(i) for i in token_ids)


def leaf(tree: RolloutTree, parent: int, text: str, turn: int, reward: float, **episode: Any) -> int:
    nid = tree.add(parent, "model", ids(text), turn=turn)
    tree.nodes[nid].info.update(action=text, episode={"turns": turn + 1, **episode})
    tree.set_reward(nid, reward)
    return nid


def calc_tree(seed: int, rewards: tuple[float, float, float]) -> RolloutTree:
    """A prompt, a calculator call, its result, then a branch point: two answers; plus a direct answer."""
    tree = RolloutTree(f"toolgym/Calculator-v0#{seed}", ids("<|user|>What is 37*58?"))
    tree.meta.update(env_id="toolgym/Calculator-v0", seed=seed, tools=CALC, answer="2146")
    call = tree.add(0, "model", ids(CALL), turn=0)
    tree.nodes[call].info.update(action=CALL, tool_calls=1)
    result = tree.add(call, "tool", ids(RESULT), turn=0)
    leaf(tree, result, "<answer>2146</answer>", 1, rewards[0], success=rewards[0] == 1.0)
    leaf(tree, result, "<answer>2000</answer>", 1, rewards[1], success=rewards[1] == 1.0)
    tree.nodes[-1].branch_reason = "entropy"
    leaf(tree, 0, "<answer>12</answer>", 0, rewards[2], success=rewards[2] == 1.0)
    return tree


def fault_tree(seed: int) -> RolloutTree:
    tree = RolloutTree(f"toolgym/Calculator-v0#{seed}", ids("<|user|>What is 9*9?"))
    tree.meta.update(env_id="toolgym/Calculator-v0", seed=seed, tools=CALC, answer="81")
    leaf(tree, 0, "<answer>80</answer>", 0, 0.0, success=False)
    nid = leaf(tree, 0, CALL, 0, 0.0, success=False, truncation="env_error")
    tree.nodes[nid].info["infra_error"] = "sandbox died"
    return tree


def save(run: Path, step: int, forest: list[RolloutTree]) -> None:
    rows = flatten(forest, "repeat")
    node_adv = []
    for r in rows:  # GRPO-like: the leaf reward minus its group's mean, on each model node of the row
        tree = forest[r.tree]
        mean = sum(tree.nodes[x].reward or 0.0 for x in tree.leaves()) / len(tree.leaves())
        adv = (tree.nodes[r.leaf].reward or 0.0) - mean
        node_adv.append({n: adv for n in r.nodes if tree.nodes[n].kind == "model"})
    save_step(run, step, forest, rows, node_adv, [True] * len(rows), decode)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    save(run, 1, [calc_tree(1, (1.0, 0.0, 0.0)), fault_tree(2)])
    save(run, 2, [calc_tree(1, (1.0, 1.0, 0.0)), calc_tree(3, (0.0, 0.0, 0.0))])
    return run


def test_saved_trees_and_step_choice(run_dir: Path) -> None:
    import json

    (line, _) = (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    tree = json.loads(line)
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert (
        tree["uid"] == "toolgym/Calculator-v0#1"
        and tree["answer"] == "2146"
        and tree["tools"] == ["calculator"]
    )
    assert nodes[1]["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "37*58"}}]
    assert nodes[2]["kind"] == "tool" and nodes[2]["text"] == RESULT and len(nodes[2]["children"]) == 2
    assert [a["value"] for a in nodes[1]["advantages"]] == pytest.approx([2 / 3, -1 / 3])  # in both rows
    assert nodes[3]["reward"] == 1.0 and nodes[3]["episode"]["success"] is True
    assert pick_steps([1, 2], None) == [1, 2] and pick_steps([1, 2], "2") == [2]
    with pytest.raises(ConfigError, match="not saved"):
        pick_steps([1, 2], "7")
    with pytest.raises(ConfigError, match="--save-rollouts"):
        write_view(run_dir.parent)


def test_the_cli_writes_the_page(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "view.html"
    done = processes.run(
        [sys.executable, "-m", "toolgym", "view", str(run_dir), "--steps", "2", "-o", str(out)],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert '"step": 2' in page and '"step": 1' not in page
    assert "http://" not in page and "https://" not in page  # self-contained: no CDN


@pytest.mark.browser
def test_the_page_in_chromium(run_dir: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium")
    # a turn text that tries to close the script element must stay text
    save(run_dir, 3, [calc_tree(4, (0.5, 0.0, 0.0))])
    tree = run_dir / "rollouts" / "step_000003.jsonl"
    tree.write_text(tree.read_text().replace("What is 37*58?", "What is </script><b>37*58</b>?"))
    page_path = write_view(run_dir)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            requests: list[str] = []
            errors: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            trees = page.locator("details.tree")
            visible = page.locator("details.tree:visible")
            assert trees.count() == 5 and visible.count() == 5
            assert "(5 of 5 trees)" in page.locator("#count").inner_text()

            # task filter: the task of seed 1 was drawn at steps 1 and 2
            page.select_option("#f-task", "toolgym/Calculator-v0#1")
            assert visible.count() == 2
            # a reward range on top: both have a leaf at 0
            page.fill("#f-max", "0.1")
            assert visible.count() == 2
            page.fill("#f-min", "0.9")  # a leaf in [0.9, 0.1]: none
            assert visible.count() == 0 and page.locator("#empty").is_visible()
            page.fill("#f-max", "")
            assert visible.count() == 2
            page.select_option("#f-task", "")
            assert visible.count() == 2  # the trees with a leaf reward >= 0.9 are seed 1's
            page.fill("#f-min", "0.4")
            assert visible.count() == 3  # and step 3's, with a leaf at 0.5
            page.fill("#f-min", "")
            page.select_option("#f-outcome", "env_error")
            assert visible.count() == 1 and "#2" in visible.first.locator(".uid").inner_text()
            page.select_option("#f-outcome", "")
            page.select_option("#f-step", "1")
            assert visible.count() == 2

            # open a tree: branch points, tool calls, observations, rewards, advantages
            first = visible.first
            first.locator("summary").click()
            # the body is built by the "toggle" event, a task queued after the click: wait for it (count()
            # does not wait, and under load the click returned before it ran)
            first.locator(".branchpoint").first.wait_for()
            assert first.locator(".branchpoint").count() == 2  # after the prompt, after the tool result
            assert first.locator(".branches").first.locator(":scope > .branch").count() == 2
            assert "calculator(" in first.locator(".calls").first.inner_text()
            # the tool result is shown as its message; the template's tokens only with "template tokens"
            tool = first.locator(".node.tool").first
            assert tool.locator(".msgs .role").all_inner_texts() == ["user"]
            assert tool.locator(".msgs pre").inner_text() == "<tool_response>\n2146\n</tool_response>"
            assert "<|im_" not in tool.inner_text() and not tool.locator(".rawtext").is_visible()
            page.check("#f-raw")
            assert tool.locator(".rawtext").inner_text() == RESULT.rstrip("\n") or (
                "<|im_start|>user" in tool.locator(".rawtext").inner_text()
            )
            assert not tool.locator(".msgs").is_visible()
            page.uncheck("#f-raw")
            assert "adv 0.667" in first.locator(".node.model .adv").nth(1).inner_text()
            assert first.locator(".leaf.win").count() == 1 and first.locator(".leaf.loss").count() == 2
            page.fill("#f-min", "0.5")  # leaves below the range are dimmed
            assert first.locator(".node.dim").count() == 2
            page.screenshot(path=str(tmp_path / "viewer.png"), full_page=True)

            page.fill("#f-min", "")
            page.select_option("#f-step", "3")
            third = visible.first
            third.locator("summary").click()
            assert "What is </script><b>37*58</b>?" in third.locator(".node.prompt .msgs pre").inner_text()
            assert errors == []
            assert all(u.startswith("file://") for u in requests), requests  # nothing from the network
        finally:
            browser.close()
    assert (tmp_path / "viewer.png").stat().st_size > 10_000


def test_a_real_training_run_saves_its_trees(tmp_path: Path) -> None:
    """Two GRPO steps (tiny model, ARPO-style branching) with ``save_rollouts=1``, then the page."""
    pytest.importorskip("torch")
    import json

    from tests.trainers.conftest import FAKE_ENV, register_fake_env, tiny_model, tiny_tokenizer
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    tokenizer = tiny_tokenizer()
    cfg = GRPOConfig(
        steps=2, output_dir=str(tmp_path), env_ids=[FAKE_ENV], env_kwargs={}, prompts_per_step=1, budget=4,
        max_new_tokens=6, max_total_tokens=256, device="cpu", tensorboard=False, progress=False,
        eval_episodes=2, micro_batch_rows=4, branching="turn_entropy",
        branch_kwargs={"entropy_weight": 0.0, "tau": 0.0}, save_rollouts=1,
    )  # fmt: skip
    train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    files = sorted(p.name for p in (tmp_path / "rollouts").iterdir())
    assert files == ["step_000001.jsonl", "step_000002.jsonl"]
    trees = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trees) == 1
    for tree in trees:
        leaves = [n for n in tree["nodes"] if not n["children"] and n["id"] != 0]
        assert len(leaves) == 4 and all(n["reward"] is not None for n in leaves)
        assert any(len(n["children"]) >= 2 for n in tree["nodes"])  # branch points
        model = [n for n in tree["nodes"] if n["kind"] == "model"]
        assert model and all("advantages" in n for n in model)
    page = write_view(tmp_path, steps="last").read_text()
    assert trees[0]["uid"] in page
