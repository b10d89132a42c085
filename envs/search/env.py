"""toolgym/Search-v0: answer multi-hop questions by searching a local corpus (or a Search-R1 server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.search import expert
from toolgym.envs.search.corpus import QAItem, load_questions
from toolgym.envs.search.questions import KINDS_BY_HOPS, QuestionMaker
from toolgym.envs.search.retriever import format_hits
from toolgym.envs.search.sources import open_source
from toolgym.errors import ConfigError
from toolgym.rewards.qa import normalize_answer, token_f1_score
from toolgym.tools import Tool

MAX_QUERY_CHARS = 1000


@dataclass
class SearchEpisode:
    em: float = 0.0  # exact match of the final answer (success), whichever score ``reward`` pays


class SearchEnv(ToolEnv):
    """Multi-hop question answering by searching a corpus with BM25.

    ## Description
    Each episode is one question whose answer follows only from the corpus. The default corpus is a seeded
    synthetic encyclopedia of invented people, places, organisations and works (``num_passages`` passages,
    10,000 by default; up to 2,000,000), so no answer can come from pretraining; questions need 1–4 hops
    (single lookups, bridges, compositions, comparisons, intersections). Users' corpora (JSONL
    ``id``/``title``/``text``) and QA files (HotpotQA, NQ, Search-R1 JSONL or parquet) load with ``corpus=`` and
    ``questions=``; ``retriever_url=`` sends searches to a Search-R1-style server instead of a local index.

    ## Action Space
    Text or an assistant message with ``tool_calls``. Hermes format by default
    (``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``, answer with
    ``<answer>…</answer>`` or the ``answer`` tool). ``action_format="tags"`` is Search-R1's protocol:
    ``<search>query</search>``, results inside ``<information>…</information>``, ``<answer>…</answer>``.

    ## Observation Space
    ``Messages``: the system prompt and the question on reset; then the search results (Search-R1's
    ``Doc 1(Title: …) text`` lines), or feedback after an invalid action.

    ## Tools
    ``search(query)``: the top ``topk`` passages (BM25). ``answer(answer)``: the final answer.

    ## Rewards
    ``correct``: exact match (``reward="em"``, default) or token F1 (``reward="f1"``) of the answer against the
    gold aliases, SQuAD-normalised (``toolgym.rewards.qa``), or the [0, 1] score of a judge model
    (``reward="judge"``, ``judge=``: see FreeQA-v0; a judge that fails ends the episode as ``env_error``).
    ``format``: ``format_penalty`` (-0.1) on each
    invalid action, and ``format_bonus`` (default 0) on a final answer given in an episode with no invalid
    action. Success means an exact match. ``info["gold"]`` holds the gold aliases for trainers (e.g. IGPO's
    information gain); it never appears in the messages.

    ## Starting State
    A question drawn with ``np_random``: ``hops`` (1–4; None draws one uniformly) and ``question_kinds``;
    or a question of the loaded file.

    ## Episode End
    Terminated by a final answer. Truncated after ``max_turns`` turns (``turn_limit``), by ``token_budget`` /
    ``time_limit_s`` when set, or with ``env_error`` when the retrieval server fails (never scored).

    ## Arguments
    ``num_passages`` (10000), ``world_seed`` (0), ``hops`` (None), ``question_kinds`` (None: all),
    ``corpus`` (None), ``questions`` (None), ``retriever_url`` (None), ``topk`` (3),
    ``reward`` ("em"; "f1", "judge"), ``judge`` (None),
    ``format_bonus`` (0.0), ``format_penalty`` (-0.1), ``max_turns`` (10), ``action_format`` ("hermes" or
    "tags"), ``prompt_format`` ("tools" or "text"), ``timeout_s`` (10), ``retries`` (3),
    ``show_progress`` (False: progress bars when an index is built).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "search"
    expert_success_rate: ClassVar[float] = 0.95
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")

    def __init__(
        self,
        *,
        num_passages: int = 10_000,
        world_seed: int = 0,
        hops: int | None = None,
        question_kinds: list[str] | tuple[str, ...] | None = None,
        corpus: str | None = None,
        questions: str | None = None,
        retriever_url: str | None = None,
        topk: int = 3,
        reward: str = "em",
        judge: Any = None,
        format_bonus: float = 0.0,
        max_turns: int = 10,
        timeout_s: float = 10.0,
        retries: int = 3,
        show_progress: bool = False,
        **kwargs: Any,
    ) -> None:
        if reward not in ("em", "f1", "judge"):
            raise ConfigError(f"reward must be 'em', 'f1' or 'judge', got {reward!r}")
        if not 1 <= topk <= 50:
            raise ConfigError(f"topk must be between 1 and 50, got {topk}")
        if hops is not None and hops not in KINDS_BY_HOPS:
            raise ConfigError(f"hops must be None or 1, 2, 3, 4; got {hops}")
        known = {k for ks in KINDS_BY_HOPS.values() for k in ks}
        if question_kinds is not None and not set(question_kinds) <= known:
            raise ConfigError(f"question_kinds must be among {sorted(known)}, got {list(question_kinds)}")
        self.hops = hops
        self.question_kinds = tuple(question_kinds) if question_kinds else None
        self.topk = topk
        self.reward = reward
        self.judge = None
        if reward == "judge":  # a model grades the answer against the gold aliases (toolgym.rewards.judge)
            from toolgym.rewards.judge import as_judge

            self.judge = as_judge(judge)
        self.format_bonus = format_bonus
        self.source = open_source(
            num_passages=num_passages,
            world_seed=world_seed,
            corpus=corpus,
            retriever_url=retriever_url,
            timeout_s=timeout_s,
            retries=retries,
            show_progress=show_progress,
        )
        self.items: list[QAItem] | None = load_questions(questions) if questions else None
        if self.items is None and self.source.world is None:
            raise ConfigError(
                "a corpus of your own needs questions=PATH (HotpotQA / NQ / Search-R1 JSONL or parquet); "
                "only the synthetic corpus (or one written by `toolgym search-index --synthetic`) makes its own"
            )
        self.maker = QuestionMaker(self.source.world) if self.source.world is not None else None
        super().__init__(max_turns=max_turns, **kwargs)

    # ----- tools -------------------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        def search(query: str) -> str:
            """Search the corpus and return the top passages.

            Args:
                query: what to look for, e.g. a name or a short phrase.
            """
            return self._search(query)

        def answer(answer: str) -> str:
            """Give the final answer and end the episode.

            Args:
                answer: the answer alone: a name, a place, a date or a year.
            """
            return answer

        return [Tool(search), Tool(answer)]

    def _search(self, query: str) -> str:
        query = " ".join(query.split())
        if not query:
            return "Error: the query is empty."
        if len(query) > MAX_QUERY_CHARS:
            return f"Error: the query is longer than {MAX_QUERY_CHARS} characters."
        hits = self.source.retriever.retrieve([query], self.topk)[0]
        text = format_hits(hits)
        return f"<information>{text}</information>" if self.action_format == "tags" else text

    def instructions(self) -> str:
        if self.action_format == "tags":
            return (
                "Answer the given question. Reason inside <think> and </think> whenever you get new "
                "information. If you lack some knowledge, call the search engine with <search> query </search>; "
                "the top results come back between <information> and </information>. You may search as many "
                "times as you need. When no more knowledge is needed, give the answer alone inside <answer> and "
                "</answer>, for example <answer> Port Elvane </answer>."
            )
        return (
            "Answer the question using the search tool over an encyclopedia. Questions may need several "
            "searches: look up each entity by its name and follow the facts from passage to passage. Give the "
            "final answer alone (a name, a place, a date or a year), without explanation."
        )

    def example(self) -> str:
        return (
            "user: Question: Which city is the birthplace of Ada Lorne?\n"
            'assistant: <tool_call>{"name": "search", "arguments": {"query": "Ada Lorne"}}</tool_call>\n'
            "tool: Doc 1(Title: Ada Lorne) Ada Lorne was a poet, born in Port Elvane on 3 May 1871. ...\n"
            "assistant: <answer>Port Elvane</answer>"
        )

    # ----- tasks and rewards -------------------------------------------------------------------------------
    def new_episode(self) -> SearchEpisode:
        return SearchEpisode()

    def make_task(self) -> Task:
        if self.items is not None:
            item = self.items[int(self.np_random.integers(len(self.items)))]
            return Task(
                task_id=f"qa-{item.qid}",
                prompt=f"Question: {item.question}",
                answer=list(item.answers),
                data={"hops": None, "kind": "file", "plan": None, "question": item.question},
            )
        assert self.maker is not None
        hops = self.hops if self.hops is not None else int(self.np_random.integers(1, 5))
        kinds = [k for k in KINDS_BY_HOPS[hops] if self.question_kinds is None or k in self.question_kinds]
        if not kinds:
            raise ConfigError(f"no question kind of {self.question_kinds} exists at {hops} hops")
        kind = kinds[int(self.np_random.integers(len(kinds)))]
        q = self.maker.make(self.np_random, hops, kind)
        return Task(
            task_id=q.qid,
            prompt=f"Question: {q.text}",
            answer=list(q.answers),
            data={"hops": q.hops, "kind": q.kind, "plan": q.plan, "question": q.text},
        )

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """The gold answers, hops and question kind: for trainers only (IGPO-style rewards); the policy's
        messages never contain them."""
        data = self.task.data
        return {"gold": list(self.task.answer), "hops": data["hops"], "question_kind": data["kind"]}

    def check_answer(self, answer: str) -> dict[str, float]:
        golds = [g for g in self.task.answer if normalize_answer(g)]
        pred = normalize_answer(answer)
        em = self.episode.em = float(bool(pred) and any(pred == normalize_answer(g) for g in golds))
        score = em if self.reward == "em" else max((token_f1_score(answer, g) for g in golds), default=0.0)
        if self.judge is not None:
            from toolgym.rewards.judge import judge_answer

            score = judge_answer(self.judge, self.task.data["question"], answer, golds)
        parts = {"correct": score if pred else 0.0}
        if self.format_bonus and self._invalid == 0:
            parts["format"] = self.format_bonus
        return parts

    def is_success(self, components: dict[str, float]) -> bool:
        return bool(self.episode.em >= 1.0)

    # ----- the scripted expert -----------------------------------------------------------------------------
    def expert_action(self) -> str:
        """Follow the question's plan by searching (see ``toolgym.envs.search.expert``). For questions loaded
        from a file there is no plan: it searches the question once, then answers with the first gold alias
        (a pipeline check, not a solver)."""
        return expert.expert_action(self.task, self._transcript, self.action_format)
