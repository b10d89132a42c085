"""A reward graded by a model: a rubric scored by any OpenAI-compatible chat server (``toolgym serve``,
vLLM, SGLang, a hosted API), in the reward functions' TRL form ``fn(completions, **kwargs)``.

What it does per batch: reads each completion's final answer (reasoning never reaches the judge), looks
up its verdict in the cache (keyed by a hash of the rubric, judge model, prompt version, question,
reference and answer), sends the misses concurrently (``concurrency`` requests in flight; identical items
in a batch are asked once; the server batches them), retries transport errors, 429/5xx answers, timeouts
and unreadable replies (``retries`` times, exponential backoff), and maps the criterion scores onto
[0, 1] (``JudgeRubric.combine``). A judge that still fails gives None (not applicable, skipped by the
trainer) and counts ``judge/infra_errors``: a judge's outage is never scored as the policy's failure. A
401/403/404 (wrong key, URL or model name) raises ``ConfigError`` at once.

What leaves for the judge server: lone surrogates replaced (no UTF-8 JSON encoder takes them: the request raised,
and the reward call with it), and with ``special_text="escape"`` (default) special-token text in the question,
reference and answer broken apart (``toolgym.special_text``), so the server's tokenizer cannot read a forged turn
in it: the special tokens of ``tokenizer`` (the judge model's, an object or a name) when given, else the known
chat markers (ChatML, Llama 3, Qwen, Mistral, Gemma, DeepSeek; ``judge_prompt`` breaks ``<|…|>`` ones as well).

``check``, an optional programmatic reward (``exact_match``, ``token_f1``, your own), caps the judge:
the score is ``min(judge, check)``, and a check of 0 skips the request. This is what makes an answer that
talks the judge into a high score worthless (``judge_prompt`` says how the prompt resists that too).

Columns: the question from ``question`` (or the last user message of ``prompts``, as TRL passes them),
the reference from ``reference`` (or ``answer``/``solution``, the other rewards' gold column), both
optional.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.errors import ConfigError
from toolgym.rewards import judge_prompt as jp
from toolgym.rewards.counters import count
from toolgym.rewards.extract import completion_text, extract_answer, message_text, strip_reasoning
from toolgym.rewards.judge_prompt import CORRECTNESS, Criterion, JudgeRubric
from toolgym.special_text import SpecialText, escaper_for, outgoing

if TYPE_CHECKING:
    import httpx

__all__ = ["CORRECTNESS", "Criterion", "Judge", "JudgeRubric", "Verdict", "judge"]

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_JUDGED_CHARS = 8000  # a longer answer is cut (head and tail kept): a judge's context is finite


@dataclass(frozen=True)
class Verdict:
    """One graded answer: the [0, 1] score (None: the judge failed), the criterion scores, the capped
    final value, and where it came from."""

    score: float | None
    scores: dict[str, float]
    reply: str
    cached: bool
    check: float | None = None

    @property
    def value(self) -> float | None:
        if self.check is not None and self.check <= 0.0:
            return 0.0  # the check rules the answer out whatever a judge would say
        if self.score is None:
            return None
        return self.score if self.check is None else min(self.score, self.check)


class VerdictCache:
    """Verdicts by content hash: in memory (LRU, ``size`` entries) and, with ``path``, appended to a JSONL
    file that later runs read back. Only successful verdicts are kept (a failure is asked again)."""

    def __init__(self, size: int = 100_000, path: str | Path | None = None) -> None:
        self.size = size
        self.path = Path(path) if path else None
        self._mem: OrderedDict[str, tuple[float, dict[str, float], str]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                    self._mem[rec["key"]] = (float(rec["score"]), dict(rec["scores"]), str(rec["reply"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line of an interrupted run

    def get(self, key: str) -> tuple[float, dict[str, float], str] | None:
        with self._lock:
            hit = self._mem.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._mem.move_to_end(key)
            self.hits += 1
            return hit

    def put(self, key: str, score: float, scores: dict[str, float], reply: str) -> None:
        with self._lock:
            self._mem[key] = (score, scores, reply)
            self._mem.move_to_end(key)
            while len(self._mem) > self.size:
                self._mem.popitem(last=False)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    rec = {"key": key, "score": score, "scores": scores, "reply": reply}
                    f.write(json.dumps(rec) + "\n")

    def __len__(self) -> int:
        return len(self._mem)

    def __getstate__(self) -> dict[str, Any]:  # picklable (verl's Ray workers take the reward): no lock
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@dataclass(frozen=True)
class _Item:
    question: str
    reference: str | None
    answer: str
    key: str


class Judge:
    """The judge reward (build it with :func:`judge`). Call it like any reward; :meth:`grade` gives the
    :class:`Verdict` objects; :meth:`agrade` is the asyncio form."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        rubric: JudgeRubric | dict[str, Any] | None = None,
        api_key: str | None = None,
        check: Callable[..., Any] | None = None,
        concurrency: int = 8,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 64,
        cache: VerdictCache | bool | str = True,
        answer_only: bool = True,
        name: str = "judge",
        transport: httpx.AsyncBaseTransport | None = None,
        special_text: SpecialText = "escape",
        tokenizer: Any = None,
    ) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the judge URL must start with http:// or https://, got {base_url!r}")
        if concurrency < 1 or retries < 0 or timeout_s <= 0 or max_tokens < 1:
            raise ConfigError("judge: need concurrency >= 1, retries >= 0, timeout_s > 0, max_tokens >= 1")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.escaper = escaper_for(special_text, tokenizer, who="judge")
        self.rubric = jp.as_rubric(rubric)
        self.api_key = api_key if api_key is not None else os.environ.get("TOOLGYM_JUDGE_API_KEY")
        self.check = check
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        if isinstance(cache, VerdictCache):
            self.cache: VerdictCache | None = cache
        elif cache is True:
            self.cache = VerdictCache()
        elif isinstance(cache, str):
            self.cache = VerdictCache(path=cache)
        else:
            self.cache = None
        self.answer_only = answer_only
        self.transport = transport
        self.__name__ = name
        self._secret = os.urandom(16)  # the markers' nonces: unknown to whoever writes the answer

    # ----- the reward --------------------------------------------------------------------------------------
    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [v.value for v in self.grade(completions, **kwargs)]

    def grade(self, completions: list[Any], **kwargs: Any) -> list[Verdict]:
        """Verdicts for a batch, from sync code (inside a running event loop too: then on a thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agrade(completions, **kwargs))
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, self.agrade(completions, **kwargs)).result()

    async def agrade(self, completions: list[Any], **kwargs: Any) -> list[Verdict]:
        items = self._items(completions, kwargs)
        checks = self._checks(completions, kwargs)
        verdicts: list[Verdict | None] = [None] * len(items)
        todo: dict[str, list[int]] = {}
        for i, (item, chk) in enumerate(zip(items, checks, strict=True)):
            if chk is not None and chk <= 0.0:
                verdicts[i] = Verdict(None, {}, "", cached=False, check=chk)  # no judge can lift a 0
                continue
            hit = self.cache.get(item.key) if self.cache is not None else None
            if hit is not None:
                verdicts[i] = Verdict(hit[0], hit[1], hit[2], cached=True, check=chk)
            else:
                todo.setdefault(item.key, []).append(i)
        if todo:
            import httpx  # here, not at import: `import toolgym.rewards` stays light

            sem = asyncio.Semaphore(self.concurrency)
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:

                async def one(idx: list[int]) -> None:
                    async with sem:
                        v = await self._ask(client, items[idx[0]])
                    for i in idx:
                        verdicts[i] = Verdict(v.score, v.scores, v.reply, v.cached, checks[i])

                await asyncio.gather(*(one(idx) for idx in todo.values()))
        out = [v for v in verdicts if v is not None]
        assert len(out) == len(items)
        failed = sum(v.value is None for v in out)
        count("judge/infra_errors", failed, kwargs.get("log_metric"))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and out:
            log_metric(f"{self.__name__}/cache_hits", float(sum(v.cached for v in out)))
        return out

    # ----- one request -------------------------------------------------------------------------------------
    async def _ask(self, client: httpx.AsyncClient, item: _Item) -> Verdict:
        import httpx

        tag = jp.nonce(self._secret, item.key)
        body: dict[str, Any] = {
            "messages": outgoing(
                jp.messages(self.rubric, item.question, item.answer, item.reference, tag), self.escaper
            ),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.model:
            body["model"] = self.model
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reply = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 4))
            try:
                resp = await client.post(f"{self.base_url}/chat/completions", json=body, headers=headers)
            except (httpx.TransportError, httpx.TimeoutException):
                continue
            if resp.status_code in (401, 403, 404):
                raise ConfigError(
                    f"the judge server {self.base_url} answered {resp.status_code} ({resp.text[:200]}): "
                    "check the URL, the API key (TOOLGYM_JUDGE_API_KEY) and the model name"
                )
            if resp.status_code in RETRY_STATUS or resp.status_code >= 400:
                continue
            try:
                reply = message_text(resp.json()["choices"][0]["message"])
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            scores = jp.parse_scores(self.rubric, reply)
            if scores is None:
                count("judge/unreadable_replies")
                if not self.temperature:  # a greedy judge repeats itself: sample the retries
                    body["temperature"] = 0.7
                continue
            score = self.rubric.combine(scores)
            if self.cache is not None:
                self.cache.put(item.key, score, scores, reply)
            return Verdict(score, scores, reply, cached=False)
        return Verdict(None, {}, reply, cached=False)

    # ----- columns -----------------------------------------------------------------------------------------
    def _items(self, completions: Sequence[Any], kwargs: dict[str, Any]) -> list[_Item]:
        n = len(completions)
        questions = _column(kwargs, ("question",), n) or [
            _prompt_text(p) for p in _column(kwargs, ("prompts", "prompt"), n) or [""] * n
        ]
        refs = _column(kwargs, ("reference", "answer", "solution"), n) or [None] * n
        items = []
        for c, q, r in zip(completions, questions, refs, strict=True):
            text = completion_text(c)
            answer = (extract_answer(text) or strip_reasoning(text)) if self.answer_only else text
            answer = _clip(answer.strip())
            ref = _reference(r)
            key = _key(self._fingerprint(), str(q), ref, answer)
            items.append(_Item(str(q), ref, answer, key))
        return items

    def _checks(self, completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
        if self.check is None:
            return [None] * len(completions)
        from toolgym.rewards.rubric import _run_sync

        cols = {k: v for k, v in kwargs.items() if k not in ("log_metric", "log_extra")}
        values = _run_sync(self.check, completions, cols)
        if len(values) != len(completions):
            raise ConfigError(f"the judge's check returned {len(values)} values for {len(completions)}")
        return [None if v is None else float(v) for v in values]

    def _fingerprint(self) -> str:
        return f"{self.rubric.fingerprint()}|{self.model}|{jp.PROMPT_VERSION}|{self.base_url}"


def judge(
    base_url: str | None = None,
    *,
    model: str | None = None,
    rubric: JudgeRubric | dict[str, Any] | None = None,
    check: Callable[..., Any] | None = None,
    **options: Any,
) -> Judge:
    """A judge reward over the chat server at ``base_url`` (default: ``$TOOLGYM_JUDGE_URL``). ``rubric``
    defaults to correctness against the reference; ``check`` caps it. See :class:`Judge` for the options
    (``concurrency``, ``timeout_s``, ``retries``, ``cache`` (True, False, a JSONL path or a
    ``VerdictCache``), ``temperature``, ``max_tokens``, ``api_key``, ``answer_only``, ``name``, ``special_text``
    ("escape" | "keep"), ``tokenizer`` (the judge model's, for which special-token text to escape)).

    >>> from toolgym.rewards.qa import exact_match
    >>> j = judge("http://127.0.0.1:9", check=exact_match, retries=0, timeout_s=1)
    >>> j(["<answer>Rome</answer>"], question=["Capital of France?"], answer=["Paris"])  # the check is 0: no request
    [0.0]
    >>> j(["<answer>Paris</answer>"], question=["Capital of France?"], answer=["Paris"])  # no server: not scored
    [None]
    """
    url = base_url or os.environ.get("TOOLGYM_JUDGE_URL")
    if not url:
        raise ConfigError("judge: give base_url (an OpenAI-compatible server) or set TOOLGYM_JUDGE_URL")
    return Judge(url, model=model, rubric=rubric, check=check, **options)


def as_judge(spec: Judge | dict[str, Any] | str | None) -> Judge:
    """An env's ``judge=`` argument as a :class:`Judge`: a Judge, :func:`judge` keywords (``{"base_url": …,
    "model": …, "rubric": {…}}``), a server URL, or None (``$TOOLGYM_JUDGE_URL``)."""
    if isinstance(spec, Judge):
        return spec
    if isinstance(spec, dict):
        return judge(**spec)
    if spec is None or isinstance(spec, str):
        return judge(spec)
    raise ConfigError(
        f"judge must be a Judge, a dict of judge() keywords or a URL, got {type(spec).__name__}"
    )


def judge_answer(j: Judge, question: str, answer: str, reference: Any = None) -> float:
    """One final answer graded inside an env's step: the judge's value, or ``InfrastructureError`` when it
    failed (the episode then ends as ``env_error`` and is never scored as the model's failure)."""
    from toolgym.errors import InfrastructureError

    verdict = j.grade([answer], question=[question], reference=[reference])[0]
    if verdict.value is None and verdict.reply and _reads_the_reference(j, question, reference):
        # the judge answered this answer, however often asked, without a readable verdict, and gives one for the
        # reference: the answer's doing (text written to derail a judge), so a wrong answer. As an env_error
        # the episode would leave the batch unscored: a way out of a low reward that a policy could learn.
        count("judge/no_verdict_answers")
        return 0.0
    if verdict.value is None:
        raise InfrastructureError(f"the judge at {j.base_url} gave no verdict after {j.retries} retries")
    return verdict.value


def _reads_the_reference(j: Judge, question: str, reference: Any) -> bool:
    """Whether the judge gives a readable verdict on the reference answer itself (a judge that cannot write
    its verdict line at all is an infrastructure fault, never the model's). Cached like any verdict."""
    gold = _reference(reference)
    if gold is None:
        return False
    first = gold.split(" | ")[0]
    return j.grade([first], question=[question], reference=[reference])[0].value is not None


# ----- helpers ---------------------------------------------------------------------------------------------
def _column(kwargs: dict[str, Any], keys: tuple[str, ...], n: int) -> list[Any] | None:
    for key in keys:
        if kwargs.get(key) is not None:
            values = list(kwargs[key])
            if len(values) != n:
                raise ConfigError(f"got {n} completions but {len(values)} values of '{key}'")
            return values
    return None


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):  # a conversation: the last user message
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return message_text(users[-1]) if users else ""
    return "" if prompt is None else str(prompt)


def _reference(gold: Any) -> str | None:
    if gold is None:
        return None
    if hasattr(gold, "tolist"):
        gold = gold.tolist()
    if isinstance(gold, dict):
        gold = gold.get("target", gold.get("aliases", gold.get("answer")))
    if isinstance(gold, (list, tuple)):
        golds = [str(g) for g in gold if g is not None]
        return " | ".join(golds) if golds else None
    return str(gold)


def _clip(text: str) -> str:
    if len(text) <= MAX_JUDGED_CHARS:
        return text
    half = MAX_JUDGED_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - MAX_JUDGED_CHARS} characters cut ...]\n{text[-half:]}"


def _key(*parts: str | None) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(("\x01" if p is None else p).encode("utf-8", "replace") + b"\0")
    return h.hexdigest()
