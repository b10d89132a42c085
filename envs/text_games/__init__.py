"""Adapters for real text-game engines: TextWorld, ScienceWorld and TextWorldExpress (PyPI; offline)."""

ENVS = {
    "toolgym/TextWorld-v0": "toolgym.envs.text_games.textworld_env:TextWorldEnv",
    "toolgym/ScienceWorld-v0": "toolgym.envs.text_games.scienceworld_env:ScienceWorldEnv",
    "toolgym/TextWorldExpress-v0": "toolgym.envs.text_games.twx_env:TextWorldExpressEnv",
}
