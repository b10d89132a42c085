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

**Content never becomes special tokens.** Tokenizing the rendered text would turn a tool result, web page,
system prompt or tool-call argument that contains ``<|im_end|>\n<|im_start|>assistant`` into real turn
markers (forged turns the policy is trained and evaluated on). So ``prompt_ids``/``env_suffix``/
``render_ids`` render the template with every string the caller passes (message contents, names, tool-call
arguments, tool schemas; not roles) cleared of special-token text: each occurrence, and a partial one at a
string's edge that could join its neighbour into one, is swapped for an alphanumeric placeholder that
survives the template's filters (``trim``, ``tojson``). The special tokens left in that text are the
template's own; the text is cut there, the placeholders restored, and the cut pieces holding them are
encoded with special tokens off (``split_special_tokens``: ``<|im_end|>`` in content is ordinary text
tokens; non-special added tokens such as Qwen's ``<tool_call>`` still match, as the model emits them).
Content without special-token text takes the exact path it always took (same ids, same cache).
``encode(text)`` encodes content (a reply, an answer) the same way; ``encode_template(text)`` encodes
template text with its special tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toolgym.errors import ConfigError
from toolgym.special_text import tokenizer_special_texts

log = logging.getLogger(__name__)

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
        self._setup_guard()
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
        self._tail_ids = self.encode_template(tail)  # after a turn that did not end with a stop token
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
        return self._template(self.prepare(messages), self._shown(tools), add_generation_prompt)

    def _shown(self, tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """The tools passed to the template: none when it does not render them."""
        return list(tools) if tools and self.renders_tools else None

    def _template(
        self, prepared: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            prepared,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        return str(text)

    def render_ids(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """Token ids of the template's rendering, special tokens only where the template writes them: special-
        token text inside any message string or tool schema is encoded as ordinary text (module docstring)."""
        text, marks = self._render_marked(messages, tools, add_generation_prompt=add_generation_prompt)
        return self._encode_marked(text, marks)

    def encode(self, text: str) -> list[int]:
        """Token ids of content text (a reply, an answer; no BOS): special-token text in it, e.g. a literal
        ``<|im_end|>``, is encoded as ordinary text tokens. Text without any is ``encode_template(text)``."""
        if self._guard is None or self._guard.search(text) is None:
            return self.encode_template(text)
        return self._encode_plain(text)

    def encode_template(self, text: str) -> list[int]:
        """Token ids of template text, special tokens included (no BOS added). Never for content: a special
        token's text inside ``text`` becomes that special token.

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
            if self.encode_template(sample) != reference:
                self._split = None
        self._cache.clear()

    # ----- content is never special tokens -------------------------------------------------------------------
    def _setup_guard(self) -> None:
        """The special tokens' texts (tokens marked special, the tokenizer's special tokens, the stop tokens),
        their partial forms, and their ids: what content text must never turn into."""
        tok = self.tokenizer
        found = set(tokenizer_special_texts(tok))
        for i in self.stop_ids:
            with contextlib.suppress(Exception):
                found.add(str(tok.convert_ids_to_tokens(i)))
        specials = sorted((t for t in found if len(t) >= 2), key=lambda t: (-len(t), t))
        alternation = "|".join(re.escape(t) for t in specials)
        self._guard: re.Pattern[str] | None = re.compile(alternation) if specials else None
        self._cut: re.Pattern[str] | None = re.compile(f"(?={alternation})") if specials else None
        # a string that ends with "<|im_" or starts with "end|>" could join a neighbour into a special token;
        # looked up by length in sets (Llama 3 has 256 reserved special tokens: thousands of such fragments)
        self._heads = {t[:k] for t in specials for k in range(2, len(t))}
        self._tails = {t[-k:] for t in specials for k in range(2, len(t))}
        self._head_lens = sorted({len(h) for h in self._heads}, reverse=True)
        self._tail_lens = sorted({len(t) for t in self._tails}, reverse=True)
        self._head_starts = "".join({h[0] for h in self._heads})
        self._tail_ends = "".join({t[-1] for t in self._tails})
        ids = set()
        for t in specials:
            with contextlib.suppress(Exception):
                tid = tok.convert_tokens_to_ids(t)
                if isinstance(tid, int) and tok.convert_ids_to_tokens(tid) == t:  # not the unknown token
                    ids.add(tid)
        self._special_ids = ids
        self._plain: Any = None
        self._plain_cache: dict[str, list[int]] = {}
        self._verify_left = 16  # marked renders compared with the template's own text

    def _suspect(self, s: str) -> bool:
        assert self._guard is not None
        return self._guard.search(s) is not None or self._edges(s) != (0, 0)

    def _edges(self, s: str) -> tuple[int, int]:
        """The lengths of the longest partial special token that ``s`` starts with and that it ends with."""
        lead = trail = 0
        if self._tail_lens and any(c in s[: self._tail_lens[0]] for c in self._tail_ends):
            lead = next((n for n in self._tail_lens if len(s) >= n and s[:n] in self._tails), 0)
        if self._head_lens and any(c in s[-self._head_lens[0] :] for c in self._head_starts):
            trail = next((n for n in self._head_lens if len(s) >= n and s[-n:] in self._heads), 0)
        return lead, trail

    def _tainted(self, value: Any) -> bool:
        if isinstance(value, str):
            return self._suspect(value)
        if isinstance(value, dict):
            return any(self._tainted(k) or self._tainted(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return any(self._tainted(v) for v in value)
        return False

    def _render_marked(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> tuple[str, _Marks | None]:
        """The rendering with special-token text in caller strings swapped for placeholders (None: there was
        none, and the text is the template's own rendering)."""
        shown = self._shown(tools)
        # checked after the tool-role fallback: it parses JSON arguments, and "\\u003c|im_end|>" is "<|im_end|>" then
        prepared = self.prepare(messages)
        tainted = self._guard is not None and (
            any(
                self._tainted(k) or (k != "role" and self._tainted(v)) for m in prepared for k, v in m.items()
            )
            or self._tainted(shown)
        )
        if not tainted:
            return self._template(prepared, shown, add_generation_prompt), None
        marks = _Marks(self, json.dumps([prepared, shown], default=str, ensure_ascii=False))
        hidden = [{k: (v if k == "role" else marks.hide(v)) for k, v in m.items()} for m in prepared]
        text = self._template(hidden, marks.hide(shown), add_generation_prompt)
        if self._verify_left > 0:  # a diagnostic only (the ids are safe either way): the first few renders
            real = self._template(prepared, shown, add_generation_prompt)
            self._verify_left -= 1
            if marks.restore(text) != real:
                self._verify_left = 0
                log.warning(
                    "the chat template transforms message text that holds special-token text; such content "
                    "is encoded as the template rendered it with placeholders, which differs from its own text"
                )
        return text, marks

    def _encode_marked(self, text: str, marks: _Marks | None) -> list[int]:
        """Ids of marked template text: cut at the template's special tokens; pieces with placeholders are
        restored and encoded with special tokens off, the others exactly as ``encode_template``."""
        if marks is None or self._cut is None or marks.prefix not in text:
            return self.encode_template(text)
        assert self._guard is not None
        ids: list[int] = []
        for chunk in self._cut.split(text):
            if not chunk:
                continue
            if marks.prefix not in chunk:
                ids += self.encode_template(chunk)
                continue
            head = self._guard.match(chunk)  # the template's special token that starts this piece
            if head is not None:
                ids += self.encode_template(head.group())
                chunk = chunk[head.end() :]
            ids += self._encode_plain(marks.restore(chunk))
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        """Ids of text with special tokens off: their text is ordinary text tokens (cached like template pieces:
        a group of rollouts renders the same first prompt once per sample)."""
        got = self._plain_cache.get(text)
        if got is None:
            if len(self._plain_cache) >= 1024:
                self._plain_cache.clear()
            got = self._plain_cache[text] = self._spell_plain(text)
        return list(got)

    def _spell_plain(self, text: str) -> list[int]:
        ids = self._plain_backend(text)
        if self._special_ids.isdisjoint(ids) or self._guard is None:
            return ids
        # the backend still matched one (a stop token the tokenizer does not mark special): spell it out
        out: list[int] = []
        pos = 0
        for m in self._guard.finditer(text):
            out += self._plain_backend(text[pos : m.start()])
            for ch in m.group():
                out += self._plain_backend(ch)
            pos = m.end()
        return out + self._plain_backend(text[pos:])

    def _plain_backend(self, text: str) -> list[int]:
        if not text:
            return []
        if self._plain is None:
            self._plain = self._make_plain()
        return list(self._plain(text))

    def _make_plain(self) -> Any:
        """An encoder that does not cut text at special tokens: a private copy of the fast tokenizer with
        ``encode_special_tokens`` on (the shared one is left as it is), else ``split_special_tokens=True``."""
        fast = getattr(self.tokenizer, "_tokenizer", None)
        if self._use_fast and fast is not None:
            try:
                from tokenizers import Tokenizer

                private = Tokenizer.from_str(fast.to_str())
                private.encode_special_tokens = True
                return lambda t: private.encode(t, add_special_tokens=False).ids
            except Exception:  # an old tokenizers: the transformers switch below
                pass
        tok = self.tokenizer
        return lambda t: tok.encode(t, add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    # ----- ids ---------------------------------------------------------------------------------------------
    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The first prompt of an episode: the conversation so far plus the generation prompt."""
        return self.render_ids(messages, tools, add_generation_prompt=True)

    def close_turn(self, generated: Sequence[int]) -> list[int]:
        """Template ids that follow a generated turn (the end-of-turn token when the model did not stop)."""
        if generated and generated[-1] in self.stop_ids:
            return list(self._tail_after_stop)
        return list(self._tail_ids)

    def env_suffix(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Env/tool messages rendered after a closed assistant turn, plus the next generation prompt."""
        full, marks = self._render_marked([*_DUMMY, *messages], None, add_generation_prompt=True)
        if not full.startswith(self._closed_text):
            raise ConfigError(
                "the chat template rewrites earlier turns when messages are appended, so prompts cannot stay "
                "token-faithful; use another template (chat_template=...) — check_template shows where"
            )
        return self._encode_marked(full[len(self._closed_text) :], marks)

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


class _Marks:
    """Placeholders for the special-token text of one rendering's strings: ``<prefix><n>z``, alphanumeric so
    that template filters (trim, tojson, escaping) keep it, with a prefix that none of the strings holds."""

    def __init__(self, renderer: ChatRenderer, seen: str) -> None:
        assert renderer._guard is not None
        self._guard = renderer._guard
        self._edges = renderer._edges
        digest = hashlib.sha1(seen.encode("utf-8", "surrogatepass")).hexdigest()
        while f"Tg{digest[:12]}n" in seen:
            digest = hashlib.sha1(digest.encode()).hexdigest()
        self.prefix = f"Tg{digest[:12]}n"
        self._pattern = re.compile(re.escape(self.prefix) + r"(\d+)z")
        self._originals: list[str] = []

    def hide(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._hide_text(value)
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.hide(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.hide(v) for v in value)
        return value

    def _hide_text(self, s: str) -> str:
        spans = [(m.start(), m.end()) for m in self._guard.finditer(s)]
        lead, trail = self._edges(s)
        if lead:
            spans.append((0, lead))
        if trail:
            spans.append((len(s) - trail, len(s)))
        if not spans:
            return s
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out, pos = [], 0
        for start, end in merged:
            out += [s[pos:start], f"{self.prefix}{len(self._originals)}z"]
            self._originals.append(s[start:end])
            pos = end
        return "".join([*out, s[pos:]])

    def restore(self, text: str) -> str:
        def back(m: re.Match[str]) -> str:
            k = int(m.group(1))
            return self._originals[k] if k < len(self._originals) else m.group()

        return self._pattern.sub(back, text)


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
