"""GEM's text games (PyPI ``gem-llm``, ``gem.make``) as toolgym envs: ``toolgym/GEM-<Game>-<level>-v0``.

The ids are GEM 0.1.0's games that run offline and reset (its math, QA and code envs download Hugging Face
datasets, Hangman, WordSearch and Wordle download NLTK's word list at run time, and two "random" levels fail in
GEM's own reset, so they are left out; see docs/peers.md). Listing them imports nothing; ``gem`` (seconds to import) loads on the first reset, and
without it a reset says what to install.
"""

GAMES = {
    "Crosswords": ("easy", "hard"),  # GEM's "random" level fails in its reset (no words match)
    "FifteenPuzzle": ("easy", "hard"),  # GEM's "random" level fails in its reset (num_rows None)
    "Game2048": ("easy", "hard", "extreme-hard", "random"),
    "GuessTheNumber": ("easy", "hard", "random"),
    "Mastermind": ("easy", "hard", "random"),
    "Minesweeper": ("easy", "hard", "random"),
    "Sokoban": ("easy", "hard", "random"),
    "Sudoku": ("easy", "hard", "random"),
    "TowerofHanoi": ("easy", "hard", "random"),
}


def gem_id(game: str, level: str) -> str:
    """GEM's own id: ``game:Sudoku-v0-easy``."""
    return f"game:{game}-v0-{level}"


def env_id(game: str, level: str) -> str:
    return f"toolgym/GEM-{game}-{level}-v0"


def class_name(game: str, level: str) -> str:
    return f"GEM_{game}_{level.replace('-', '_')}"


ENVS = {"toolgym/GEM-v0": "toolgym.envs.gem.env:GemEnv"}
ENVS.update(
    {
        env_id(game, level): f"toolgym.envs.gem.env:{class_name(game, level)}"
        for game, levels in GAMES.items()
        for level in levels
    }
)
