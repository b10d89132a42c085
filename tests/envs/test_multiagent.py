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
