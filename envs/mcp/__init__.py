"""The MCP family: any MCP server's tools as env tools (``mcp=`` on every env), and MCP-v0, a task set over
the shop server. Needs the ``mcp`` extra."""

ENVS = {"toolgym/MCP-v0": "toolgym.envs.mcp.env:MCPEnv"}
