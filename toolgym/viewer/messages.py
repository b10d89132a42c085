"""A node's decoded tokens as the messages they hold, for ``toolgym view``.

A tree node's text is its tokens decoded, chat-template markup included: an env node reads
``<|im_end|>\\n<|im_start|>user\\n4<|im_end|>\\n<|im_start|>assistant\\n``. The page shows the messages
(role, content) and the markup only on demand, so this module reads the markup of the common template
families (ChatML, Llama 3, Gemma, Mistral-style ``[INST]``) back into messages, and strips any other special
token (``<|…|>``, ``<s>``) from the text.
"""

from __future__ import annotations

import re
from typing import Any

# (where a message starts, naming its role; where it ends): ChatML (Qwen, SmolLM), Llama 3, Gemma
_TURNS = (
    (re.compile(r"<\|im_start\|>([^\n<]*)\n?"), re.compile(r"<\|im_end\|>")),
    (re.compile(r"<\|start_header_id\|>([^<]*)<\|end_header_id\|>\n*"), re.compile(r"<\|eot_id\|>")),
    (re.compile(r"<start_of_turn>([^\n<]*)\n?"), re.compile(r"<end_of_turn>")),
)
_INST = re.compile(r"\[/?INST\]")
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|<pad>|<bos>|<eos>")
_ROLE_OF_KIND = {"model": "assistant", "prompt": "", "tool": "tool", "user": "user", "env": ""}


def plain(text: str) -> str:
    """``text`` without template tokens.

    >>> plain("<s>[INST] 2*3? [/INST] 6</s><|endoftext|>")
    ' 2*3?  6'
    """
    return _SPECIAL.sub("", _INST.sub("", text))


def to_messages(text: str, kind: str = "") -> list[dict[str, str]]:
    """The messages in a node's decoded ``text``; text before the first role marker belongs to the node's own
    turn (a model node's reply is the assistant's). Empty messages (the generation prompt) are left out.

    >>> to_messages("<|im_end|>\\n<|im_start|>user\\n4<|im_end|>\\n<|im_start|>assistant\\n", "env")
    [{'role': 'user', 'content': '4'}]
    >>> to_messages("<calculator>2*3</calculator><|im_end|>", "model")
    [{'role': 'assistant', 'content': '<calculator>2*3</calculator>'}]
    >>> to_messages("<|start_header_id|>user<|end_header_id|>\\n\\nHi<|eot_id|>")
    [{'role': 'user', 'content': 'Hi'}]
    >>> to_messages("no markup at all", "tool")
    [{'role': 'tool', 'content': 'no markup at all'}]
    """
    own = _ROLE_OF_KIND.get(kind, "")
    for start, end in _TURNS:
        if not start.search(text):
            continue
        messages: list[dict[str, str]] = []
        pos, role = 0, own
        for m in start.finditer(text):
            _add(messages, role, end.split(text[pos : m.start()], maxsplit=1)[0])
            role, pos = m.group(1).strip(), m.end()
        _add(messages, role, end.split(text[pos:], maxsplit=1)[0])
        return messages
    messages = []
    _add(messages, own, text)
    return messages


def _add(messages: list[dict[str, str]], role: str, text: str) -> None:
    content = plain(text).strip("\n")
    if content.strip():
        messages.append({"role": role, "content": content})


def with_messages(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with each node's ``messages`` (its text read back; the raw text stays in ``text``)."""
    nodes = [
        dict(n, messages=to_messages(str(n.get("text") or ""), str(n.get("kind", "")))) for n in tree["nodes"]
    ]
    return dict(tree, nodes=nodes)
