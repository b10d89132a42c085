"""toolgym: environments, sandboxes, rewards and a trainer for multi-turn, tool-using LLM agents.

Importing toolgym registers every ``toolgym/…`` id with Gymnasium. It stays cheap: no torch, docker or
browser is imported here.
"""

from toolgym.errors import ConfigError, DependencyNotInstalled, InfrastructureError, ToolgymError
from toolgym.messages import Message, ToolCall
from toolgym.parsing import ParseResult, parse_action
from toolgym.tools import Tool, ToolSpec
from toolgym.vector import make_vec

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DependencyNotInstalled",
    "InfrastructureError",
    "Message",
    "ParseResult",
    "Tool",
    "ToolCall",
    "ToolSpec",
    "ToolgymError",
    "__version__",
    "make_vec",
    "parse_action",
]

from toolgym.envs.registration import register_all as _register_all

_register_all()
