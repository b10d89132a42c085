"""Chat rendering that keeps tokens faithful across turns.

A multi-turn episode is one growing token sequence. ``ChatRenderer`` renders the first prompt with the
tokenizer's chat template; after that it never re-renders the past. Each model turn contributes exactly the
ids it sampled; the renderer appends

- ``close_turn(generated)``: the template's tokens after an assistant turn (e.g. ``"\\n"`` after
  ``<|im_end|>``, or ``<|im_end|>\\n`` when the turn hit ``max_new_tokens``), and
- ``env_suffix(messages)``: the env's messages rendered as a suffix, ending with the generation prompt.

So the prompt ids of turn k+1 start with exactly the prompt ids of turn k plus its generated ids. Suffixes
are found by rendering a short fixed conversation with and without the new messages and tokenizing the
difference; a template for which the difference is not a suffix (it rewrites earlier turns) raises
``ConfigError``; ``check_template`` says where a template breaks, turn by turn.

**Templates without a tool role** (SmolLM2's renders ``<|im_start|>tool``, a role the model never saw):
``tool_role="user"`` (chosen by ``"auto"`` when the template never mentions ``"tool"``) renders each run of
tool messages as one user message of ``<tool_response>\\n…\\n</tool_response>`` blocks (the Hermes/Qwen
convention), and assistant tool calls that came without text as ``<tool_call>{json}</tool_call>`` text.
Such templates usually ignore ``tools=`` too: make the env describe its tools in the system prompt
(``prompt_format="text"``; ``ChatRenderer.renders_tools`` says which).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toolgym.errors import ConfigError

ToolRole = Literal["auto", "native", "user"]
_DUMMY = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def _template_source(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()))
    if not template:
        raise ConfigError(
            f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template: "
            "set tokenizer.chat_template or use an instruct model"
        )
    return str(template)


def to_user_tool_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool-role fallback: runs of tool messages become one user message of ``<tool_response>`` blocks.

    >>> to_user_tool_messages([{"role": "tool", "content": "4"}, {"role": "tool", "content": "5"}])
    [{'role': 'user', 'content': '<tool_response>\\n4\\n</tool_response>\\n<tool_response>\\n5\\n</tool_response>'}]
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_run"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_run": True})
        elif m.get("role") == "assistant" and m.get("tool_calls") and not (m.get("content") or "").strip():
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function", c)
                args = fn.get("arguments", {})
                args = json.loads(args) if isinstance(args, str) and args.strip() else (args or {})
                calls.append(f"<tool_call>{json.dumps({'name': fn['name'], 'arguments': args})}</tool_call>")
            out.append({"role": "assistant", "content": "\n".join(calls)})
        else:
            out.append(
                {k: v for k, v in m.items() if k != "tool_calls"} if m.get("role") == "assistant" else m
            )
    return [{k: v for k, v in m.items() if k != "_tool_run"} for m in out]


class ChatRenderer:
    """Token-faithful rendering with a tokenizer's chat template (see the module docstring)."""

    def __init__(
        self, tokenizer: Any, *, tool_role: ToolRole = "auto", chat_template: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template or _template_source(tokenizer)
        if tool_role == "auto":
            tool_role = (
                "native" if ("'tool'" in self.chat_template or '"tool"' in self.chat_template) else "user"
            )
        if tool_role not in ("native", "user"):
            raise ConfigError(f"tool_role must be 'auto', 'native' or 'user', got {tool_role!r}")
        self.tool_role: Literal["native", "user"] = tool_role
        self.renders_tools = "tools" in self.chat_template
        self.stop_ids = self._stop_ids()
        self._setup_encoder()
        closed = self.render_text(_DUMMY)
        opened = self.render_text(_DUMMY[:1], add_generation_prompt=True)
        reply = _DUMMY[1]["content"]
        if not (closed.startswith(opened) and closed[len(opened) :].startswith(reply)):
            raise ConfigError(
                "this chat template does not render an assistant turn as generation prompt + text + tail; "
                "token-faithful rendering needs that (run toolgym.agents.check_template for details)"
            )
        self._closed_text = closed
        tail = closed[len(opened) + len(reply) :]
        self._tail_ids = self.encode(tail)  # after a turn that did not end with a stop token
        self._tail_after_stop = [i for i in self._tail_ids]
        if self._tail_ids and self._tail_ids[0] in self.stop_ids:
            self._tail_after_stop = self._tail_ids[1:]
        self.end_of_turn_id = self._end_of_turn_id()

    # ----- text --------------------------------------------------------------------------------------------
    def prepare(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template gets them (tool-role fallback applied; None content as "")."""
        msgs = [dict(m, content=m.get("content") or "") for m in messages]
        return to_user_tool_messages(msgs) if self.tool_role == "user" else msgs

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            self.prepare(messages),
            tools=list(tools) if tools and self.renders_tools else None,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text, special tokens included (no BOS added).

        Text is cut before each special token and the pieces are encoded separately, with a cache: tokenizers
        split on special tokens before anything else, so this is exact (checked at construction; off when
        not), and the system prompt or the generation prompt are encoded once per run, not once per turn.
        """
        if self._split is None:
            return self._encode_raw(text)
        ids: list[int] = []
        for chunk in self._split.split(text):
            if not chunk:
                continue
            got = self._cache.get(chunk)
            if got is None:
                if len(self._cache) >= 8192:
                    self._cache.clear()
                got = self._cache[chunk] = self._encode_raw(chunk)
            ids += got
        return ids

    def _encode_raw(self, text: str) -> list[int]:
        fast = getattr(self.tokenizer, "_tokenizer", None)
        if self._use_fast and fast is not None:
            return list(fast.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _setup_encoder(self) -> None:
        """Chunked, cached encoding when it gives the same ids as encoding the whole text."""
        self._cache: dict[str, list[int]] = {}
        self._split: re.Pattern[str] | None = None
        self._use_fast = False
        sample = self.render_text(
            [{"role": "system", "content": " Sys tem\n\n"}, *_DUMMY, {"role": "user", "content": "x  \n y"}],
            add_generation_prompt=True,
        )
        reference = list(self.tokenizer.encode(sample, add_special_tokens=False))
        fast = getattr(self.tokenizer, "_tokenizer", None)
        if fast is not None and hasattr(fast, "encode"):
            with contextlib.suppress(Exception):
                self._use_fast = list(fast.encode(sample, add_special_tokens=False).ids) == reference
        specials = []
        for token in getattr(self.tokenizer, "added_tokens_decoder", {}).values():
            content = getattr(token, "content", "")
            if getattr(token, "special", False) and not getattr(token, "lstrip", False) and content in sample:
                specials.append(content)
        if specials:
            self._split = re.compile(
                "(?=" + "|".join(re.escape(t) for t in sorted(specials, key=len)[::-1]) + ")"
            )
            if self.encode(sample) != reference:
                self._split = None
        self._cache.clear()

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    # ----- ids ---------------------------------------------------------------------------------------------
    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The first prompt of an episode: the conversation so far plus the generation prompt."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def close_turn(self, generated: Sequence[int]) -> list[int]:
        """Template ids that follow a generated turn (the end-of-turn token when the model did not stop)."""
        if generated and generated[-1] in self.stop_ids:
            return list(self._tail_after_stop)
        return list(self._tail_ids)

    def env_suffix(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Env/tool messages rendered after a closed assistant turn, plus the next generation prompt."""
        full = self.render_text([*_DUMMY, *messages], add_generation_prompt=True)
        if not full.startswith(self._closed_text):
            raise ConfigError(
                "the chat template rewrites earlier turns when messages are appended, so prompts cannot stay "
                "token-faithful; use another template (chat_template=...) — check_template shows where"
            )
        return self.encode(full[len(self._closed_text) :])

    def strip_stop(self, generated: Sequence[int]) -> list[int]:
        """The generated ids without a trailing stop token (for decoding the reply text)."""
        return list(generated[:-1]) if generated and generated[-1] in self.stop_ids else list(generated)

    def _end_of_turn_id(self) -> int | None:
        """The token that ends an assistant turn: the one the template writes right after a reply (e.g.
        ``<|im_end|>``), else the tokenizer's EOS when it stops generation, else the smallest stop id. SFT
        appends it to every reply, so the model learns to stop where the rollout engine stops it."""
        if self._tail_ids and self._tail_ids[0] in self.stop_ids:
            return self._tail_ids[0]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int) and eos in self.stop_ids:
            return eos
        return min(self.stop_ids) if self.stop_ids else None

    def _stop_ids(self) -> set[int]:
        tok = self.tokenizer
        ids: set[int] = set()
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(int(tok.eos_token_id))
        for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
            if token in self.chat_template or token == getattr(tok, "eos_token", None):
                tid = tok.convert_tokens_to_ids(token)
                if isinstance(tid, int) and tid != getattr(tok, "unk_token_id", None):
                    ids.add(tid)
        return ids


@dataclass(frozen=True)
class TemplateCheck:
    """Result of ``check_template``: ``ok`` when every turn's prompt extends the previous prompt + reply."""

    ok: bool
    tool_role: str
    turns: int
    mismatch_turn: int | None = None
    position: int | None = None
    expected: str = ""
    got: str = ""

    def __str__(self) -> str:
        if self.ok:
            return f"prefix-consistent over {self.turns} tool turns (tool role: {self.tool_role})"
        return (
            f"not prefix-consistent at turn {self.mismatch_turn}, token {self.position} "
            f"(tool role: {self.tool_role}): expected {self.expected!r}, got {self.got!r}"
        )


def sample_tool_conversation(turns: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A synthetic ``turns``-turn calculator conversation (messages, tools) ending with an answer."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "e.g. 37*58"}},
                    "required": ["expression"],
                },
            },
        }
    ]
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calculator, then answer as <answer>N</answer>."},
        {"role": "user", "content": "What is 2*3*4*5*6*7?"},
    ]
    value = 1
    for k in range(2, 2 + turns - 1):
        expr = f"{value}*{k}"
        value *= k
        call = {"name": "calculator", "arguments": {"expression": expr}}
        msgs.append(
            {
                "role": "assistant",
                "content": f"<tool_call>{json.dumps(call)}</tool_call>",
                "tool_calls": [
                    {
                        "id": f"call_{k}",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": json.dumps(call["arguments"])},
                    }
                ],
            }
        )
        msgs.append(
            {"role": "tool", "tool_call_id": f"call_{k}", "name": "calculator", "content": str(value)}
        )
    msgs.append({"role": "assistant", "content": f"<answer>{value}</answer>"})
    return msgs, tools


def check_template(
    tokenizer: Any,
    *,
    tool_role: ToolRole = "auto",
    chat_template: str | None = None,
    turns: int = 5,
) -> TemplateCheck:
    """Whether rendering the whole conversation afresh at each turn extends the previous prompt + reply.

    For each assistant turn k of a ``turns``-turn tool conversation, the template's prompt for turn k+1
    must start with the template's prompt for turn k followed by the reply's ids and the stop token, i.e.
    what incremental rendering produces. The first mismatch is reported (turn, token position, the decoded
    tokens expected and got).
    """
    renderer = ChatRenderer(tokenizer, tool_role=tool_role, chat_template=chat_template)
    msgs, tools = sample_tool_conversation(turns)
    stop = renderer.end_of_turn_id
    assistant_at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    incremental: list[int] = []
    for k, i in enumerate(assistant_at):
        prompt = renderer.prompt_ids(msgs[:i], tools)
        if k == 0:
            incremental = list(prompt)
        else:
            prev_end = assistant_at[k - 1] + 1
            incremental += renderer.env_suffix(msgs[prev_end:i])
        for j, (a, b) in enumerate(zip(incremental, prompt, strict=False)):
            if a != b:
                return _mismatch(renderer, k + 1, j, incremental, prompt)
        if len(incremental) != len(prompt):
            return _mismatch(renderer, k + 1, min(len(incremental), len(prompt)), incremental, prompt)
        reply = renderer.encode(msgs[i]["content"]) + ([stop] if stop is not None else [])
        incremental += reply + renderer.close_turn(reply)
    return TemplateCheck(ok=True, tool_role=renderer.tool_role, turns=len(assistant_at))


def _mismatch(renderer: ChatRenderer, turn: int, pos: int, inc: list[int], full: list[int]) -> TemplateCheck:
    return TemplateCheck(
        ok=False,
        tool_role=renderer.tool_role,
        turns=turn,
        mismatch_turn=turn,
        position=pos,
        expected=renderer.decode(inc[max(0, pos - 3) : pos + 8]),
        got=renderer.decode(full[max(0, pos - 3) : pos + 8]),
    )
