"""Network servers on FastAPI + uvicorn: ``toolgym serve-env`` (any env over WebSocket/HTTP, OpenEnv's
protocol) and ``toolgym serve-reward`` (a rubric in OpenRLHF's remote reward shape). ``toolgym serve`` (a
policy behind the OpenAI API) lives in ``toolgym.agents.openai_server``. See docs/interop.md.

``protocol`` holds the wire messages and imports nothing heavy: ``toolgym/Remote-v0`` uses it client-side.
"""
