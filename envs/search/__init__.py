"""The search family: multi-hop QA over a local corpus (BM25 via bm25s) or a Search-R1 retrieval server."""

ENVS = {"toolgym/Search-v0": "toolgym.envs.search.env:SearchEnv"}
