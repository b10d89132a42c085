"""The free-form QA family: open questions answered in words, graded by token F1 or by a judge model."""

ENVS = {
    "toolgym/FreeQA-v0": "toolgym.envs.free_qa.env:FreeQAEnv",
}
