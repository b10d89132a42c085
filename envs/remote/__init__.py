"""The remote family: an env served elsewhere (``toolgym serve-env``, or any OpenEnv server) driven over its
WebSocket protocol."""

ENVS = {
    "toolgym/Remote-v0": "toolgym.envs.remote.env:RemoteEnv",
}
