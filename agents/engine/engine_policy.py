"""``EnginePolicy``: the engine behind the ``Policy``/``TokenPolicy`` protocols (a drop-in for ``HFPolicy``).

``generate(prompts, sampling)`` takes plain prompt ids like ``HFPolicy``. Before anything runs, each
prompt is matched against the sequences the engine still holds: a prompt that extends an earlier turn
(its prompt + sampled ids + the env's reply) continues that turn's cache and prefills only the new ids; a
prompt that shares a prefix with a held sequence (a branch of a rollout tree) forks it (the prefix is
copied, not recomputed). Prompts that match nothing but repeat one another (a GRPO group) or share a
long prefix (a system prompt) run that prefix once and fork it. The engine's own handles
(``engine.new / fork / extend / submit / step``) serve callers that track their sequences themselves
(the episode runner's continuous batching).

Logprobs: those of the distribution each token was drawn from (see ``sampling.py``); with the default
``top_p=1`` (and ``top_k=0``) that is ``softmax(logits / temperature)``, as ``HFPolicy`` reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolgym.agents.engine.engine import Engine, Seq
from toolgym.agents.engine.prefix import PrefixIndex
from toolgym.agents.engine.sampling import SampleMode
from toolgym.agents.hf import common_prefix, open_model, pad_id
from toolgym.agents.policy import (
    Generation,
    RenderedTokenPolicy,
    SamplingParams,
)
from toolgym.agents.rendering import ChatRenderer, ToolRole
from toolgym.errors import ConfigError

if TYPE_CHECKING:
    import torch


def mode_of(sp: SamplingParams, top_k: int = 0) -> SampleMode:
    return SampleMode(
        temperature=max(sp.temperature, 0.0), top_p=sp.top_p, top_k=top_k, entropies=sp.return_entropies
    )


def plan_turns(
    policy: Any, prompts: Sequence[list[int]], sampling: SamplingParams | None, seed_engine: bool = True
) -> tuple[SamplingParams, SampleMode, list[Any]]:
    """The start of ``generate`` for a policy over a sequence engine (``EnginePolicy``, ``VLLMPolicy``): the
    sampling (``sampling`` or the policy's) and its mode; every prompt must have a token; then, when there are
    any, new weights are picked up, the engine is seeded (``seed``; not with ``seed_engine=False``, whose
    caller keys its turns instead: ``Engine.submit(key=)``) and one new sequence is planned per prompt
    (``policy._plan``; none for no prompts)."""
    sp = sampling or policy.sampling
    if any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token")
    if not prompts:
        return sp, mode_of(sp, policy.top_k), []
    policy.refresh()
    if sp.seed is not None and seed_engine:
        policy.engine.seed(sp.seed)
    return sp, mode_of(sp, policy.top_k), policy._plan([list(p) for p in prompts])


Carried = tuple[
    list[int], list[float], list[float]
]  # what a turn sampled before a restart: ids, logprobs, entropies
NOTHING_CARRIED: Carried = ([], [], [])


def restart_turn(engine: Any, seq: Any, carried: Carried = NOTHING_CARRIED) -> tuple[Any, Carried]:
    """``seq`` (queued or generating) taken out of ``engine`` and submitted again with what it has sampled
    appended to its context, so the rest of the turn comes from a fresh prefill (new weights: keeping the old
    keys/values would mix two versions). Its new sequence, and everything the turn has sampled so far
    (``carried`` from earlier restarts, then this sequence's). A keyed turn keeps its key: its noise goes on
    at the same positions."""
    carried = (carried[0] + list(seq.out), carried[1] + list(seq.logprobs), carried[2] + list(seq.entropies))
    left = seq.max_new - len(seq.out)
    engine.cancel(seq)
    fresh = engine.new(seq.ids + seq.out, tag=seq.tag)
    if seq.key:
        engine.submit(fresh, seq.mode, left, seq.stop, key=seq.key)
    else:  # (an engine without keys, the vLLM one, takes this too)
        engine.submit(fresh, seq.mode, left, seq.stop)
    return fresh, carried


def with_carried(gen: Generation, carried: Carried) -> Generation:
    """A restarted turn's whole generation: what it sampled before its restarts, then ``gen``."""
    out, lps, ents = carried
    if not out:
        return gen
    return dataclasses.replace(
        gen, token_ids=out + gen.token_ids, logprobs=lps + gen.logprobs,
        entropies=None if gen.entropies is None else ents + gen.entropies,
    )  # fmt: skip


class EnginePolicy(RenderedTokenPolicy):
    """A Llama/Qwen2 HF model served by our ``Engine``; ``model``/``tokenizer`` as for ``HFPolicy``.

    ``slots`` sequences of up to ``capacity`` tokens are held at once (the KV cache is allocated up front:
    ``engine.cache.nbytes()``). ``min_shared_prefix``: the shortest common prefix of unrelated prompts
    that is prefilled once and forked.
    """

    continuous_serving = True  # toolgym serve batches its requests continuously (agents/openai_continuous.py)

    def __init__(
        self,
        model: str | Any = "smollm2-135m",
        tokenizer: Any = None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        sampling: SamplingParams | None = None,
        tool_role: ToolRole = "auto",
        chat_template: str | None = None,
        slots: int = 64,
        capacity: int = 2048,
        top_k: int = 0,
        min_shared_prefix: int = 32,
        cuda_graphs: bool | None = None,
        engine_dtype: torch.dtype | None = None,
    ) -> None:
        from toolgym.agents.engine.weights import unsupported

        self.name, model, tokenizer = open_model("engine", "EnginePolicy", model, tokenizer, device, dtype)
        why = unsupported(model)
        if why is not None:
            raise ConfigError(f"the fast engine cannot run this model: {why}; use the hf backend")
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.top_k = top_k
        self.min_shared_prefix = min_shared_prefix
        self._renderer = ChatRenderer(tokenizer, tool_role=tool_role, chat_template=chat_template)
        self.pad_id = pad_id(tokenizer, self._renderer)
        self.engine = Engine(
            model, slots=slots, capacity=capacity, stop_ids=self._renderer.stop_ids,
            decode_text=self._renderer.decode, cuda_graphs=cuda_graphs, dtype=engine_dtype,
        )  # fmt: skip
        self.index = PrefixIndex()
        self.engine.on_evict = self.index.remove

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    @property
    def device(self) -> torch.device:
        return self.engine.device

    # ----- tokens ------------------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Pick up new weights (seen by itself after any optimizer step or in-place write; ``force`` after a
        write through ``p.data``); held caches are then dropped."""
        if self.engine.refresh(force):
            self.index.clear()

    def check_prompts(self, prompts: Sequence[list[int]]) -> None:
        """A ConfigError for a prompt the engine cannot take: past its capacity, or an id outside the model's
        vocabulary (a tokenizer with more ids than the embedding: an index fault on the device otherwise)."""
        cap = self.engine.cache.capacity
        if any(len(p) >= cap - 1 for p in prompts):
            longest = max(len(p) for p in prompts)
            raise ConfigError(f"a prompt of {longest} tokens does not fit the engine's capacity ({cap})")
        vocab = self.engine.weights.shape.vocab
        if any(p and (min(p) < 0 or max(p) >= vocab) for p in prompts):
            bad = next(t for p in prompts for t in p if t < 0 or t >= vocab)
            raise ConfigError(f"token id {bad} is outside the model's vocabulary (0..{vocab - 1})")

    def generation(self, seq: Seq) -> Generation:
        return Generation(
            list(seq.out), list(seq.logprobs), seq.finish,  # type: ignore[arg-type]
            list(seq.entropies) if seq.mode.entropies else None,
        )  # fmt: skip

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """One continuation per prompt (ids in, ids + logprobs out), continuing held caches where they match."""
        # (before any prompt is planned: a refusal leaves nothing queued and no slot taken)
        self.check_prompts(prompts)
        sp, mode, seqs = plan_turns(self, prompts, sampling)
        if not seqs:
            return []
        eng = self.engine
        for s in seqs:
            eng.submit(s, mode, sp.max_new_tokens, sp.stop)
        while eng.busy():
            for s in eng.step():
                self.index.add(s)
        return [self.generation(s) for s in seqs]

    def _plan(self, prompts: list[list[int]]) -> list[Seq]:
        """A sequence per prompt: continued or forked from held caches, or new (shared prefixes run once)."""
        eng = self.engine
        out: list[Seq | None] = [None] * len(prompts)
        claims: dict[int, list[tuple[int, int]]] = {}
        sources: dict[int, Seq] = {}
        for i, p in enumerate(prompts):
            src, n = self.index.match(p)
            if src is not None and src.state == "idle":
                claims.setdefault(src.id, []).append((i, n))
                sources[src.id] = src
        for sid, src in sources.items():  # taken out of the idle pool first: nothing evicts a source
            self.index.remove(src)
            eng.idle.pop(sid, None)
            src.state = "new"
        for sid, items in claims.items():
            src = sources[sid]
            items.sort(key=lambda x: -x[1])
            # the first claimant takes the source's slot itself only when it continues everything the source
            # holds (an episode's next turn); a branch from inside the source (a fork of a tree node whose
            # turn went on) gets a copy, and the source stays held for the path it belongs to
            take = items[0][1] >= src.kv
            for i, n in items[1:] if take else items:  # copies first
                out[i] = eng.fork(src, prompts[i], n)
            if take:
                i, n = items[0]
                src.ids, src.kv = prompts[i], min(src.kv, n)
                out[i] = src
            else:
                src.state = "idle"
                eng.idle[sid] = src
                self.index.add(src)
        fresh = [i for i in range(len(prompts)) if out[i] is None]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in fresh:
            groups.setdefault(tuple(prompts[i]), []).append(i)
        leaders = [members[0] for members in groups.values()]
        root = None
        if len(leaders) > 1:
            shared = common_prefix([prompts[i] for i in leaders])
            if shared >= self.min_shared_prefix:
                root = eng.new(prompts[leaders[0]][:shared])
                eng.prefill_only([root], [shared])
        heads: dict[int, Seq] = {}  # leader -> its sequence (out's entries are Optional; these are set)
        for i in leaders:
            out[i] = heads[i] = (
                eng.fork(root, prompts[i], len(prompts[i]) - 1) if root is not None else eng.new(prompts[i])
            )
        multi = [(heads[members[0]], members) for members in groups.values() if len(members) > 1]
        eng.prefill_only([h for h, _ in multi], [len(h.ids) - 1 for h, _ in multi])
        for head, members in multi:
            for i, child in zip(
                members[1:], eng.fork_many(head, [prompts[i] for i in members[1:]]), strict=True
            ):
                out[i] = child
        if root is not None:
            eng.release(root)
        return [s for s in out if s is not None]

    def clear_kv(self) -> None:
        """Drop every held cache."""
        for seq in list(self.engine.idle.values()):
            self.engine.release(seq)
        self.index.clear()
