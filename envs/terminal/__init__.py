"""The terminal family: Harbor-format tasks done with a shell in a docker container."""

ENVS = {"toolgym/Terminal-v0": "toolgym.envs.terminal.env:TerminalEnv"}
