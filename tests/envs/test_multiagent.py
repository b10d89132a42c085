import copy

import numpy as np
import pytest

from toolgym.envs.multiagent.api import REFEREE, GameMessage, MessageLog
from toolgym.envs.werewolf.agents import POLICIES, view_of
from toolgym.envs.werewolf.rules import Move, WerewolfGame
from toolgym.errors import EpisodeOverError


def test_message_visibility_and_cursor():
    log = MessageLog()
    log.post(REFEREE, "public")
    log.post(REFEREE, "for P1", ("P1",))
    assert [m.text for m in log.unread("P1")] == ["public", "for P1"]
    assert [m.text for m in log.unread("P2")] == ["public"]
    log.mark_read("P1")
    log.post("P2", "hello")
    assert [m.text for m in log.unread("P1")] == ["hello"]
    assert len(log.seen_by("P1")) == 3
    assert GameMessage("P3", "x", ("P3",)).render() == "P3 (private): x"


def test_aec_loop_plays_a_whole_game():
    game = WerewolfGame(n_players=6)
    game.reset(seed=11)
    rng = np.random.default_rng(0)
    turns = 0
    for agent in game.agent_iter():
        obs, reward, term, trunc, info = game.last()
        assert isinstance(obs, list) and reward == 0.0
        assert agent in game.agents and not (term or trunc)
        assert info["role"] == game.roles[agent]
        game.step(POLICIES["basic"](view_of(game, agent), rng))
        turns += 1
    assert game.done and game.agents == [] and turns > 6
    assert sorted(game.rewards.values())[-1] == 1.0


def test_observe_is_incremental_and_pure():
    game = WerewolfGame(n_players=5)
    game.reset(seed=0)
    agent = game.agent_selection
    first = game.observe(agent)
    assert game.observe(agent) == first  # observing changes nothing
    assert any("Your role: werewolf" in m.text for m in first)
    target = next(p for p in game.alive if game.roles[p] != "werewolf")
    game.step(Move(kind="kill", target=target))
    assert not any("Your role" in m.text for m in game.observe(agent))  # read when it moved


def test_a_deep_copy_forks_the_game():
    game = WerewolfGame(n_players=7)
    game.reset(seed=5)
    fork = copy.deepcopy(game)
    for g in (game, fork):
        rng = np.random.default_rng(1)
        for agent in g.agent_iter():
            g.step(POLICIES["strong"](view_of(g, agent), rng))
    assert [m.render() for m in game.log.messages] == [m.render() for m in fork.log.messages]


def test_agent_iter_raises_on_a_stuck_game():
    game = WerewolfGame(n_players=5)
    game.reset(seed=0)
    with pytest.raises(EpisodeOverError):
        for _ in game.agent_iter(max_iter=3):
            game.step(Move(kind="vote", target="P1"))  # illegal at night: the game never moves on


def test_self_play_table_credits_each_seat():
    from toolgym.envs.werewolf.env import self_play_table
    from toolgym.envs.werewolf.expert import expert_action

    table = self_play_table(["P1", "P2", "P3"], seed=3)
    rng = np.random.default_rng(0)
    turns = 0
    while (seat := table.next_seat()) is not None:
        chat = table.messages(seat)
        assert chat[0]["role"] == "system" and chat[-1]["role"] == "user"
        assert "Your move" in chat[-1]["content"]
        # every 5th turn is garbage: a message saying why and a penalty, then the same seat again
        table.act(
            seat, "<tool_call>nonsense" if turns % 5 == 0 else expert_action(table.game, seat, rng, "hermes")
        )
        turns += 1
    returns = table.returns()
    invalid = {s: r.invalid for s, r in table.records.items()}
    assert sum(invalid.values()) == (turns + 4) // 5
    for seat in ("P1", "P2", "P3"):
        won = table.game.rewards[seat] - table.game.illegal_penalty * table.game.illegal[seat]
        assert returns[seat] == pytest.approx(won - 0.1 * invalid[seat])
        assert "Roles:" in table.messages(seat)[-1]["content"]  # the game's end reaches every seat
    with pytest.raises(EpisodeOverError):
        table.act("P1", "hello")


def test_self_play_table_rejects_unknown_seats():
    from toolgym.envs.werewolf.env import self_play_table
    from toolgym.errors import ConfigError

    with pytest.raises(ConfigError):
        self_play_table(["P9"], seed=0)
