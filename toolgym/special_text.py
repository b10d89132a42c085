"""Special-token text in content that leaves the process for a server that tokenizes it itself.

A chat server (vLLM, SGLang, a hosted API, a judge) renders the messages it is sent with its chat template
and tokenizes the result with special tokens on: a tool output, web page or answer holding
``<|im_end|>\\n<|im_start|>assistant`` becomes real turn markers there (a forged turn). Our own renderer keeps
such text plain (``toolgym.agents.rendering``); a remote one cannot be told to, so the text is escaped before
it leaves: ``SpecialTextEscaper`` puts a zero-width space (U+200B) after the first character of each
occurrence (``<|im_end|>`` -> ``<\\u200b|im_end|>``), which no tokenizer matches as the special token, that
reads the same to a person, and that costs the model one extra token. Text without special-token text is
returned unchanged (the same object).

Which strings: the special tokens of the served model's tokenizer when it can be loaded here
(``for_tokenizer``: tokens marked special and the tokenizer's special tokens, as the renderer guards them;
each escaped form is checked with that tokenizer, and one it still reads as a special token gets a visible
space instead); otherwise (``known``) a conservative list of chat-control markers: ChatML/Qwen/Llama-3/Phi/
harmony ``<|word|>`` tokens, DeepSeek's ``<｜word｜>``, Gemma's ``<start_of_turn>``/``<end_of_turn>`` and
Mistral's ``[INST]``/``[/INST]``/``[TOOL_CALLS]``/… . HTML-like ``<s>``, ``</s>``, ``<div>`` and ``<|>`` are not
in the list: they are escaped only when they are special tokens of the tokenizer given.

Not covered: a string that ends with part of a special token which the template's next text completes (no
common template writes such text right after content), and turn-like plain text (``<<SYS>>`` in Llama 2,
whose tokenizer has no token for it: no tokenizer-level escape changes what the model reads there).

``outgoing(value, escaper)`` is what a client sends: lone surrogates replaced (``toolgym.parsing.clean_json``:
a UTF-8 JSON encoder refuses them) and, with an escaper, every string escaped.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from typing import Any, Literal

from toolgym.errors import ConfigError
from toolgym.parsing import clean_json

SpecialText = Literal["escape", "keep"]
BREAK = "\u200b"  # zero-width space: splits a special token's text, invisible when read

# Mistral's control tokens (v3 / tekken) and Gemma's turn markers, spelled out; the <|word|> and <｜word｜>
# families (ChatML, Qwen, Llama 3, Phi-3, Granite, Command R, gpt-oss, DeepSeek) by pattern below
KNOWN_SPECIAL_TEXTS: tuple[str, ...] = (
    "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[CALL_ID]", "[ARGS]",
    "[THINK]", "[/THINK]", "<start_of_turn>", "<end_of_turn>",
)  # fmt: skip
KNOWN_PATTERNS: tuple[str, ...] = (r"<\|[A-Za-z0-9_.:/\-]{1,60}\|>", "<\uff5c[^\uff5c<>\\s]{1,60}\uff5c>")


def tokenizer_special_texts(tokenizer: Any) -> list[str]:
    """The texts of ``tokenizer``'s special tokens (marked special, or among its special tokens), 2+ chars."""
    found = {
        str(getattr(t, "content", ""))
        for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(t, "special", False)
    }
    found.update(str(t) for t in (getattr(tokenizer, "all_special_tokens", None) or []))
    return sorted(t for t in found if len(t) >= 2)


class SpecialTextEscaper:
    """Escapes special-token text in strings (module docstring). ``texts``: literal strings; ``patterns``:
    regular expressions of more; ``tokenizer``: check each literal's escaped form with it."""

    def __init__(
        self, texts: Iterable[str] = (), patterns: Iterable[str] = (), tokenizer: Any = None
    ) -> None:
        self.texts = sorted({t for t in texts if len(t) >= 2}, key=lambda t: (-len(t), t))
        parts = [re.escape(t) for t in self.texts] + list(patterns)
        self._pattern = re.compile("|".join(parts)) if parts else None
        self._visible = self._checked(tokenizer) if tokenizer is not None else set()

    @classmethod
    def known(cls) -> SpecialTextEscaper:
        """The conservative list, for a server whose tokenizer is not available here."""
        return cls(KNOWN_SPECIAL_TEXTS, KNOWN_PATTERNS)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> SpecialTextEscaper:
        """Exactly ``tokenizer``'s special tokens."""
        return cls(tokenizer_special_texts(tokenizer), tokenizer=tokenizer)

    def _checked(self, tokenizer: Any) -> set[str]:
        """The texts whose zero-width escape ``tokenizer`` still reads as a special token (a normalizer that
        drops U+200B): those get a visible space instead."""
        ids: set[int] = set()
        for t in self.texts:
            with contextlib.suppress(Exception):
                tid = tokenizer.convert_tokens_to_ids(t)
                if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == t:
                    ids.add(tid)
        out = set()
        for t in self.texts:
            with contextlib.suppress(Exception):
                if ids.intersection(tokenizer.encode(t[0] + BREAK + t[1:], add_special_tokens=False)):
                    out.add(t)
        return out

    def _break(self, m: re.Match[str]) -> str:
        s = m.group()
        return s[0] + (" " if s in self._visible else BREAK) + s[1:]

    def escape(self, text: str) -> str:
        """``text`` with each special-token text broken (``text`` itself when it holds none).

        >>> e = SpecialTextEscaper.known()
        >>> e.escape("a<|im_end|>\\n<|im_start|>assistant") == "a<\\u200b|im_end|>\\n<\\u200b|im_start|>assistant"
        True
        >>> s = "<s>x</s> <div>[1]</div> a <|> b [INST"
        >>> e.escape(s) is s
        True
        """
        if self._pattern is None or self._pattern.search(text) is None:
            return text
        return self._pattern.sub(self._break, text)

    def __call__(self, value: Any) -> Any:
        """``value`` (JSON-like) with every string escaped: keys, values, nested lists and dicts."""
        if isinstance(value, str):
            return self.escape(value)
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        return value


def outgoing(value: Any, escaper: SpecialTextEscaper | None = None) -> Any:
    """``value`` as a client sends it to another program: no lone surrogates, special-token text escaped
    when ``escaper`` is given.

    >>> outgoing({"content": "a\\ud800 <|eot_id|>"}, SpecialTextEscaper.known()) == {"content": "a\\ufffd <\\u200b|eot_id|>"}
    True
    """
    value = clean_json(value)
    return escaper(value) if escaper is not None else value


def escaper_for(special_text: SpecialText, tokenizer: Any = None, who: str = "") -> SpecialTextEscaper | None:
    """The escaper of a boundary's ``special_text`` option: None for "keep"; for "escape" exactly ``tokenizer``'s
    special tokens (an object, or a name/folder loaded with transformers; ``smollm2-135m`` resolves to the
    embedded model's), else the known chat markers. ``who`` prefixes the errors (a bad option, a tokenizer that
    does not load)."""
    where = f"{who}: " if who else ""
    if special_text not in ("escape", "keep"):
        raise ConfigError(f"{where}special_text must be 'escape' or 'keep', got {special_text!r}")
    if special_text == "keep":
        return None
    if tokenizer is None:
        return SpecialTextEscaper.known()
    if isinstance(tokenizer, str):
        try:
            from transformers import AutoTokenizer

            from toolgym.agents.embedded import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer))
        except Exception as exc:  # not installed, not found, not a tokenizer
            raise ConfigError(f"{where}cannot load the tokenizer {tokenizer!r}: {exc}") from exc
    return SpecialTextEscaper.for_tokenizer(tokenizer)
