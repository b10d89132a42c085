"""The Werewolf family: a text social-deduction game for multi-agent and self-play training."""

ENVS = {
    "toolgym/Werewolf-v0": "toolgym.envs.werewolf.env:WerewolfEnv",
}
