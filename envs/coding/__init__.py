"""The coding family: implement a function or a program, run scratch code and visible tests, submit for
hidden tests; and the sandbox-backed interpreter the code envs share (``interpreter``)."""

ENVS = {"toolgym/Coding-v0": "toolgym.envs.coding.env:CodingEnv"}
