import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.base import tool_env
from toolgym.envs.checks import check
from toolgym.envs.werewolf.agents import POLICIES, play_out, view_of
from toolgym.envs.werewolf.rules import Move, WerewolfGame, deal_roles
from toolgym.errors import ConfigError, EpisodeOverError


def _game(n=7, seed=0):
    game = WerewolfGame(n_players=n)
    game.reset(seed=seed)
    return game


def _role(game, role):
    return next(p for p, r in game.roles.items() if r == role)


def test_deal_sizes():
    assert deal_roles(5).count("werewolf") == 1
    assert deal_roles(7) == ["werewolf", "werewolf", "seer", "doctor", "villager", "villager", "villager"]
    with pytest.raises(ConfigError):
        deal_roles(4)


def test_night_order_and_private_messages():
    game = _game()
    wolves = game.living("werewolf")
    seer, doctor = _role(game, "seer"), _role(game, "doctor")
    assert game.queue == [*wolves, seer, doctor] and game.agent_selection == wolves[0]
    villager = _role(game, "villager")
    game.step(Move(kind="kill", target=villager))
    # the proposal is private to the wolves
    assert any("propose" in m.text for m in game.observe(wolves[1]))
    assert not any("propose" in m.text for m in game.observe(seer))
    game.step(Move(kind="kill", target=villager))
    game.step(Move(kind="inspect", target=wolves[0]))
    assert game.observe(seer)[-1].text == f"{wolves[0]} is a werewolf."
    assert not any("is a werewolf." in m.text for m in game.observe(villager))
    game.step(Move(kind="protect", target=villager))  # the doctor saves the victim
    assert game.phase == "discussion" and len(game.alive) == 7
    assert any(m.text == "Dawn: nobody died last night." for m in game.log.messages)


def test_referee_rejects_without_crash():
    game = _game()
    wolf = game.agent_selection
    cases = [Move(kind="vote", target="P1"), Move(kind="kill", target="P99"), Move(kind="kill", target=wolf)]
    for bad in cases:
        game.step(bad)
        assert game.agent_selection == wolf  # still the same player's move
        assert game.log.messages[-1].text.startswith("Illegal move") and game.log.messages[-1].audience == (
            wolf,
        )
    assert game.rewards[wolf] == pytest.approx(-0.3) and game.illegal[wolf] == 3


def test_doctor_cannot_repeat_and_vote_tie():
    game = _game(n=5, seed=3)
    wolf, doctor = _role(game, "werewolf"), _role(game, "doctor")
    victim = next(p for p in game.alive if p not in (wolf, doctor, _role(game, "seer")))
    game.step(Move(kind="kill", target=victim))
    game.step(Move(kind="inspect", target=wolf))
    game.step(Move(kind="protect", target=doctor))
    assert victim not in game.alive
    # discussion, then a 2-2 tie among the 4 living: nobody is eliminated
    while game.phase == "discussion":
        game.step(Move(kind="speak", text="hello"))
    living = list(game.alive)
    for voter in living:
        target = living[0] if voter != living[0] and living.index(voter) % 2 else living[1]
        if target == voter:
            target = living[2]
        game.step(Move(kind="vote", target=target))
    assert game.phase in ("night", "over")
    if game.phase == "night":
        assert game.agent_selection == wolf
        game.step(Move(kind="kill", target=next(p for p in game.alive if p != wolf)))
        if game.roles.get(game.agent_selection) == "seer":
            game.step(Move(kind="inspect", target=wolf))
        if game.agent_selection == doctor:
            game.step(Move(kind="protect", target=doctor))
            assert "protected" in game.log.messages[-1].text


def test_win_condition_and_rewards():
    game = _game(n=5, seed=1)
    play_out(game, dict.fromkeys(game.possible_agents, "strong"), np.random.default_rng(0))
    assert game.phase == "over" and game.winner in ("village", "werewolves")
    for p, role in game.roles.items():
        won = (role == "werewolf") == (game.winner == "werewolves")
        assert game.rewards[p] == float(won)
    with pytest.raises(EpisodeOverError):
        game.step(Move(kind="vote", target="P1"))


def test_seeded_games_repeat():
    def transcript(seed):
        game = _game(seed=seed)
        play_out(game, dict.fromkeys(game.possible_agents, "basic"), np.random.default_rng(seed))
        return [m.render() for m in game.log.messages]

    assert transcript(4) == transcript(4)
    assert transcript(4) != transcript(5)


def test_views_hide_roles():
    game = _game(seed=2)
    villager = _role(game, "villager")
    view = view_of(game, villager)
    assert view.wolves == [] and view.role == "villager"
    wolf = game.living("werewolf")[0]
    assert sorted(view_of(game, wolf).wolves) == sorted(game.living("werewolf"))


def test_scripted_beats_random_per_side():
    games = 40
    wins = {"village": 0, "werewolves": 0}
    for seed in range(games):
        for side in wins:
            game = _game(seed=seed)
            seats = {
                p: "strong" if (r == "werewolf") == (side == "werewolves") else "random"
                for p, r in game.roles.items()
            }
            play_out(game, seats, np.random.default_rng(seed))
            wins[side] += game.winner == side
    assert wins["werewolves"] / games >= 0.9
    assert wins["village"] / games >= 0.45


def test_seat_env_plays_and_rejects():
    env = gym.make("toolgym/Werewolf-v0", seat_role="seer")
    obs, info = env.reset(seed=0)
    assert "a seer" in obs[1]["content"] and "Your move: Night 1" in obs[1]["content"]
    assert "<answer>" not in obs[0]["content"]
    _, reward, term, trunc, info = env.step(
        '<tool_call>{"name": "vote", "arguments": {"player": "P1"}}</tool_call>'
    )
    assert info["invalid_action"] and reward == pytest.approx(-0.1) and not (term or trunc)
    _, reward, _, _, info = env.step("<answer>P1</answer>")
    assert info["invalid_action"] and info["parse_error"] == "no_action"
    inner = tool_env(env)
    while True:
        _, reward, term, trunc, info = env.step(inner.expert_action())
        assert not info["invalid_action"]
        if term or trunc:
            break
    assert term and info["success"] == (reward == 1.0)


def test_plain_text_is_a_speech():
    env = gym.make("toolgym/Werewolf-v0", seat_role="villager")
    env.reset(seed=1)
    inner = tool_env(env)
    while inner.episode.game.phase != "discussion":
        env.step(inner.expert_action())
    seat = inner.episode.seat
    env.step("I am the seer. P1 is a werewolf.")
    said = [m for m in inner.episode.game.log.messages if m.sender == seat]
    assert said and said[-1].text == "I am the seer. P1 is a werewolf."


def test_bad_knobs():
    with pytest.raises(ConfigError):
        gym.make("toolgym/Werewolf-v0", opponents="genius")
    with pytest.raises(ConfigError):
        gym.make("toolgym/Werewolf-v0", n_players=9)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_only_plays_legal_moves(name):
    game = _game(seed=7)
    play_out(game, dict.fromkeys(game.possible_agents, name), np.random.default_rng(1))
    assert sum(game.illegal.values()) == 0


def test_toolgym_check_passes():
    report = check("toolgym/Werewolf-v0")
    assert report.ok, report.errors
    assert report.expert_success >= 0.4
