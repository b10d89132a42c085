"""One seat of a multi-agent game as a single-agent ``ToolEnv``: the learner plays one agent, fixed policies
play every other, so every single-agent tool (runners, trainers, ``toolgym check``, forking) works on it.

The learner's turn is a tool call (or, where the game allows, plain text: a speech); the env turns it into
the game's move, hands it to the game's referee, then lets the other seats' policies move until the learner
must move again or the game ends. The observation is everything the learner's agent may read that arrived
meanwhile (public and its private messages, not its own words echoed), and what it must do now. A move the
referee rejects is an observation and ``illegal_penalty`` (``info["invalid_action"]`` is set), never an
exception. The episode ends with the game; ``success`` is whether the learner's side won.

The whole game (its messages, its random generator, the opponents' generator) lives in ``self.episode``, so
``get_state``/``set_state`` fork a game like any other episode.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.multiagent.api import GameMessage, MultiAgentEnv
from toolgym.messages import Message
from toolgym.parsing import ParseResult
from toolgym.reasoning import strip_reasoning


def render_news(game: MultiAgentEnv[Any], seat: str, start: int) -> tuple[str, int]:
    """What ``seat`` may read among the game's messages from index ``start`` on (not its own words echoed),
    then what it must do now when it is its turn; and the index to start from next time."""
    fresh: list[GameMessage] = game.log.messages[start:]
    lines = [m.render() for m in fresh if m.visible_to(seat) and m.sender != seat]
    if not game.done and game.agent_selection == seat:
        lines.append(f"Your move: {game.prompt_for(seat)}")
    return "\n".join(lines), len(game.log.messages)


@dataclass
class SeatEpisode:
    game: Any = None  # the MultiAgentEnv of this episode
    seat: str = ""
    seed: int = 0  # the game's seed (the expert's generator derives from it and the turn)
    rng: np.random.Generator | None = None  # the opponents' generator
    shown: int = 0  # how many of the game's messages the learner has been shown
    last_illegal: bool = False
    moves: int = 0  # the learner's accepted moves

    def clone(self) -> SeatEpisode:
        return copy.deepcopy(self)


class SeatEnv(ToolEnv):
    """Base of a seat env; a game family fills in the hooks below."""

    reward_keys: ClassVar[tuple[str, ...]] = ("win", "format", "illegal")
    # plain text is a move in these phases (a call of ``speech_tool``); elsewhere it is an invalid turn
    text_phases: ClassVar[tuple[str, ...]] = ()
    speech_tool: ClassVar[str] = "say"

    def __init__(self, *, illegal_penalty: float = -0.1, **kwargs: Any) -> None:
        self.illegal_penalty = illegal_penalty
        super().__init__(**kwargs)

    # ----- hooks --------------------------------------------------------------------------------------------
    def new_game(self) -> MultiAgentEnv[Any]:
        raise NotImplementedError

    def choose_seat(self, game: MultiAgentEnv[Any], rng: np.random.Generator) -> str:
        return game.possible_agents[int(rng.integers(len(game.possible_agents)))]

    def opponent_move(self, game: MultiAgentEnv[Any], agent: str, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def move_from_call(self, game: MultiAgentEnv[Any], name: str, arguments: dict[str, Any]) -> Any:
        """The game's move for a tool call, or a str saying why the call is no move."""
        raise NotImplementedError

    def expert_move_text(self, game: MultiAgentEnv[Any], seat: str, rng: np.random.Generator) -> str:
        raise NotImplementedError

    def phase(self, game: MultiAgentEnv[Any]) -> str:
        return str(getattr(game, "phase", ""))

    def seat_won(self, game: MultiAgentEnv[Any], seat: str) -> bool:
        return game.rewards[seat] > 0

    def illegal_count(self, game: MultiAgentEnv[Any], seat: str) -> int:
        return int(getattr(game, "illegal", {}).get(seat, 0))

    def describe(self, game: MultiAgentEnv[Any], seat: str) -> str:
        """The task's title line (who the learner is)."""
        return f"You are {seat}."

    def system_prompt(self) -> str:
        prompt = super().system_prompt()
        if self.custom_system_prompt is not None:
            return prompt
        # a game has no final answer: drop the standard prompt's paragraph about one
        return "\n\n".join(part for part in prompt.split("\n\n") if "<answer>" not in part)

    # ----- the episode ------------------------------------------------------------------------------------
    def new_episode(self) -> SeatEpisode:
        return SeatEpisode()

    def make_task(self) -> Task:
        ep = self.episode
        for _ in range(100):  # a deal where the seat is out before its first move is dealt again
            ep.seed = int(self.np_random.integers(2**31 - 1))
            ep.rng = np.random.default_rng(ep.seed + 1)
            ep.game = self.new_game()
            ep.game.reset(seed=ep.seed)
            ep.seat = self.choose_seat(ep.game, self.np_random)
            self._advance()
            if not ep.game.done:
                break
        prompt = f"{self.describe(ep.game, ep.seat)}\n{self._news()}"
        return Task(
            f"{type(self).__name__}-{ep.seed}-{ep.seat}", prompt, data={"seat": ep.seat, "seed": ep.seed}
        )

    def _advance(self) -> None:
        """Let the other seats move until the learner must move or the game is over."""
        ep = self.episode
        while not ep.game.done and ep.game.agent_selection != ep.seat:
            ep.game.step(self.opponent_move(ep.game, ep.game.agent_selection, ep.rng))

    def _news(self) -> str:
        ep = self.episode
        text, ep.shown = render_news(ep.game, ep.seat, ep.shown)
        return text

    def parse(self, action: Any) -> ParseResult:
        return self.parse_for(self.episode.game if self.episode is not None else None, action)

    def parse_for(self, game: MultiAgentEnv[Any] | None, action: Any) -> ParseResult:
        """Read a turn in ``game``'s current phase (plain text is a speech in ``text_phases``): a valid move
        comes back as ``command`` (JSON of the call), for ``decode``."""
        parsed = super().parse(action)
        if parsed.answer is not None:
            return ParseResult(
                text=parsed.text,
                error="this game has no final answer: make a move with a tool call.",
                error_kind="no_action",
            )
        if parsed.ok and parsed.tool_calls:
            call = parsed.tool_calls[0]
            command = json.dumps(
                {"name": call.name, "arguments": call.arguments, "calls": len(parsed.tool_calls)}
            )
            return ParseResult(text=parsed.text, command=command, message=parsed.assistant_message())
        speech = strip_reasoning(parsed.text).strip() if isinstance(parsed.text, str) else ""
        if (
            parsed.error_kind == "no_action"
            and speech
            and game is not None
            and self.phase(game) in self.text_phases
        ):
            command = json.dumps({"name": self.speech_tool, "arguments": {"text": speech}, "calls": 1})
            return ParseResult(
                text=parsed.text, command=command, message=Message(role="assistant", content=parsed.text)
            )
        return parsed

    def decode(self, game: MultiAgentEnv[Any], command: str) -> Any:
        """The game's move for a command of ``parse_for``, or a str saying why it is none."""
        request = json.loads(command)
        move = self.move_from_call(game, request["name"], request["arguments"])
        if request["calls"] > 1 and not isinstance(move, str):
            return "one move per turn: make exactly one tool call."
        return move

    def read_move(self, game: MultiAgentEnv[Any], action: Any) -> tuple[Any, Message]:
        """A turn of a seat outside this env's own episode (self-play): the move, or a str saying why the
        turn is none (unparseable, or no legal call), and the assistant message to record."""
        parsed = self.parse_for(game, action)
        if parsed.command is None:
            return f"Invalid action: {parsed.error}", parsed.assistant_message()
        move = self.decode(game, parsed.command)
        return (f"Illegal move: {move}" if isinstance(move, str) else move), parsed.assistant_message()

    def run_command(self, command: str) -> CommandOutcome:
        ep = self.episode
        move = self.decode(ep.game, command)
        before = self.illegal_count(ep.game, ep.seat)
        if isinstance(move, str):
            ep.last_illegal = True
            text = f"Illegal move: {move} {ep.game.prompt_for(ep.seat)}"
            return CommandOutcome(text, {"illegal": self.illegal_penalty})
        ep.game.step(move)
        ep.last_illegal = self.illegal_count(ep.game, ep.seat) > before
        if ep.last_illegal:
            return CommandOutcome(self._news(), {"illegal": self.illegal_penalty})
        ep.moves += 1
        self._advance()
        news = self._news()
        if not ep.game.done:
            return CommandOutcome(news)
        won = self.seat_won(ep.game, ep.seat)
        return CommandOutcome(news, {"win": float(won)}, terminated=True, success=won)

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        ep = self.episode
        extra: dict[str, Any] = {"seat": ep.seat, "phase": self.phase(ep.game)}
        if "invalid_action" in info and ep.last_illegal:
            extra["invalid_action"] = True
            ep.last_illegal = False
        return extra

    def expert_action(self) -> str:
        ep = self.episode
        rng = np.random.default_rng([ep.seed, self._turn])  # no state of the episode is consumed
        return self.expert_move_text(ep.game, ep.seat, rng)
