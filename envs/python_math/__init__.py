"""The python_math family: math problems solved with a stateful Python tool (tool-integrated reasoning)."""

ENVS = {"toolgym/PythonMath-v0": "toolgym.envs.python_math.env:PythonMathEnv"}
