"""Scripted experts for GEM's games: each reads the game's hidden state (the number, the code, the solved
grid, the mines) or plans (Tower of Hanoi), and returns the next move as GEM expects it, ``\\boxed{…}``.
Games without one (2048, Sokoban, the 15-puzzle, crosswords) return None: their ids declare 0."""

from __future__ import annotations

from typing import Any


def _hanoi(game: Any) -> str:
    """The next move of the optimal solution from the current position (all disks to C)."""
    board = {k: list(v) for k, v in game.board.items()}
    where = {disk: peg for peg, disks in board.items() for disk in disks}

    def move(n: int, target: str) -> str | None:
        if n == 0:
            return None
        peg = where[n]
        if peg == target:
            return move(n - 1, target)
        spare = ({"A", "B", "C"} - {peg, target}).pop()
        # smaller disks first go out of the way; then disk n moves
        if any(where[d] != spare for d in range(1, n)):
            return move(n - 1, spare)
        return f"{peg} {target}"

    step = move(game.num_disks, "C")
    return f"\\boxed{{{step}}}" if step else "\\boxed{A C}"


def _sudoku(game: Any) -> str:
    for r, row in enumerate(game.board):
        for c, value in enumerate(row):
            if value == 0:
                return f"\\boxed{{{r + 1} {c + 1} {game.full_grid[r][c]}}}"
    return "\\boxed{1 1 1}"


def _minesweeper(game: Any) -> str:
    """Reveal first (GEM places the mines then), flag every mine, then reveal the safe cells: GEM ends the
    game as won on a reveal only when all mines are flagged by then."""
    if game.first_reveal:
        return f"\\boxed{{reveal {game.rows // 2} {game.cols // 2}}}"
    cells = [(r, c) for r in range(game.rows) for c in range(game.cols)]
    for r, c in cells:
        if game.grid[r][c] == -1 and not game.flags[r][c]:
            return f"\\boxed{{flag {r} {c}}}"
    for r, c in cells:
        if not game.revealed[r][c] and game.grid[r][c] != -1:
            return f"\\boxed{{reveal {r} {c}}}"
    return "\\boxed{reveal 0 0}"


def expert_move(game_name: str, game: Any) -> str | None:
    """The expert's next move in ``game`` (a GEM env after reset), or None where there is no expert."""
    if game_name == "GuessTheNumber":
        return f"\\boxed{{{game.game_number}}}"
    if game_name == "Mastermind":
        return "\\boxed{" + " ".join(str(d) for d in game.game_code) + "}"
    if game_name == "TowerofHanoi":
        return _hanoi(game)
    if game_name == "Sudoku":
        return _sudoku(game)
    if game_name == "Minesweeper":
        return _minesweeper(game)
    return None


HAS_EXPERT = ("GuessTheNumber", "Mastermind", "TowerofHanoi", "Sudoku", "Minesweeper")


def solved(game_name: str, game: Any, reward: float) -> bool:
    """Whether a finished game was won: GEM's success reward (1.0), or the game's own solved state where
    its last reward is partial (a Minesweeper board's last cell pays its share, not 1.0)."""
    if reward >= 1.0:
        return True
    if game_name == "Minesweeper":
        return bool(game._is_solved())
    if game_name == "Sudoku":
        return bool(game._is_puzzle_complete())
    if game_name == "TowerofHanoi":
        return len(game.board["C"]) == game.num_disks
    return False
