"""The calculator family: arithmetic word problems with a calculator tool."""

ENVS = {
    "toolgym/Calculator-v0": "toolgym.envs.calculator.env:CalculatorEnv",
    "toolgym/CalculatorChain-v0": "toolgym.envs.calculator.env:CalculatorChainEnv",
}
