"""The packed update path: every row's real tokens in one sequence, logprobs through a chunked LM head.

``packed_forward`` is a drop-in for ``batch.forward`` (same outputs, same alignment) that
1. packs the rows of a padded ``TrainBatch`` into one ``[1, N]`` sequence (positions restart at each row),
   so the projections, MLPs and norms of the decoder run on real tokens only;
2. runs attention per row: our attention function (registered with transformers as ``toolgym_packed``)
   lays each row's queries/keys/values out in a ``[B, H, L, D]`` block and calls SDPA with
   ``is_causal`` and no mask (FlashAttention on CUDA): a row never sees another, no ``N x N`` mask is
   built (transformers' own packed-sequence mask is dense, ``N^2`` memory and compute). Models loaded with
   a FlashAttention implementation keep it and get the packed positions, which it handles natively;
3. scores only the tokens the loss reads (``loss_mask``; ``row_mask`` too where there is one), through the LM head in chunks of ``chunk``
   tokens, each recomputed in the backward pass, so the float32 logits of a 152k vocabulary never exist
   for more than ``chunk`` tokens at a time (the padded path materialises ``[B, T, V]`` twice: logits and
   softmax). Logprob-only passes (old policy, reference) run the same way without gradients;
4. scatters the token logprobs (and entropies) back to ``[B, T]``, zero elsewhere;
5. with ``share``, runs a prefix that rows share (a GRPO group's prompt, a branched tree's earlier turns)
   once: only the first row holding a prefix packs its tokens, and attention gathers them into every row
   that holds it (``prefix_share``; our attention only: FlashAttention models and batches with nothing
   shared take the path above).

``update_forward(packing, chunk, share, compiled)`` gives the trainer its forward function; ``compiled``
also compiles the chunk scorer, so that the float32 logits of a chunk are read once or twice by fused
reductions instead of by ~10 separate elementwise kernels (the scorer is memory-bound: a 4096-token chunk of
a 152k vocabulary is 2.5 GB of float32).

Exact for the families in ``EXACT_FAMILIES`` (each checked against ``model(...).logits`` in
tests/trainers/test_packing.py): the LM head's post-processing (``LogitHead``: Granite's ``logits_scaling``,
Cohere's ``logit_scale``, Gemma2/3's final soft-cap), sliding windows (an explicit per-row mask) and Gemma2/3's
attention soft-cap (their own eager attention) are applied. Any other family is refused (``use_packing``:
``on`` is a ConfigError, ``auto`` falls back to the padded update), since its scores could silently differ.

Not covered: value heads (PPO reads hidden states of every position; use ``batch.forward``), and DDP
(the decoder and head are called directly, which bypasses DistributedDataParallel's forward: a DDP model
gets ``batch.forward``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from toolgym.errors import ConfigError
from toolgym.trainers.batch import HostMasks, TrainBatch, forward, to_device
from toolgym.trainers.prefix_share import share_layout

ATTN = "toolgym_packed"
FLASH = ("flash_attention_2", "flash_attention_3")
Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]


@dataclass(frozen=True)
class PackInfo:
    """Where each packed token sits in the ``[B, L]`` per-row layout of the attention (``flat = b * L + t``)."""

    flat: torch.Tensor  # [N] long
    rows: int  # B
    length: int  # L, the longest row
    # shared prefixes (trainers/prefix_share.py): [B * L] packed index each slot reads (N: zeros), else None
    gather: torch.Tensor | None = None


def pack(
    batch: TrainBatch, host: HostMasks | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [1, N], positions [1, N], row [N], col [N], scored [M]) of every real token, rows one after
    another; ``scored``: the packed indices of the tokens the loss reads (a token is scored by the state
    before it). With ``host`` (the masks on the host) nothing here waits for the GPU."""
    # rows are right-padded, so the mask's nonzeros in row-major order are the packed tokens and their
    # columns the positions
    if host is not None:
        nz = host.attention_mask.nonzero()  # [N, 2]
        hr, hc = nz.unbind(1)
        scored = ((hc >= 1) & (host.loss_mask[hr, hc] > 0)).nonzero().squeeze(-1)
        row, col = to_device(nz, batch.input_ids.device).unbind(1)  # [N], [N]
        k = to_device(scored, batch.input_ids.device)  # [M]
    else:  # two host syncs: the token count, and the scored count (before the decoder runs: it waits little)
        row, col = batch.attention_mask.nonzero().unbind(1)  # [N], [N]
        k = ((col >= 1) & (batch.scored_mask()[row, col] > 0)).nonzero().squeeze(-1)  # [M]
    return batch.input_ids[row, col][None], col[None], row, col, k


def _module_eager(module: Any) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The eager attention of the module's own modeling file (Gemma2/3's applies the logit soft-cap)."""
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ConfigError(
            f"{type(module).__name__} soft-caps attention logits but has no eager attention to do it"
        )
    return fn  # type: ignore[no-any-return]


def _row_mask(p: PackInfo, window: int | None, device: torch.device) -> torch.Tensor:
    """[1, 1, L, L] bool: causal, and within the sliding window (``q - window < k``, transformers' rule)."""
    q = torch.arange(p.length, device=device)
    allowed = q[None, :] <= q[:, None]  # [L, L] key <= query
    if window is not None:
        allowed &= q[None, :] > q[:, None] - window
    return allowed[None, None]


def _packed_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    toolgym_pack: PackInfo | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: per-row causal attention over packed tokens; an ordinary (padded,
    cached, generation) call runs what the model would: SDPA, or its eager attention where it soft-caps the
    attention logits (Gemma2/3: SDPA cannot)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = kwargs.pop("softcap", None)
    window = kwargs.pop("sliding_window", None)
    if toolgym_pack is None:  # `_mask` built the mask the function below expects (eager: additive float)
        if softcap is not None:
            out, _ = _module_eager(module)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, softcap=softcap,
                **kwargs,
            )  # fmt: skip
            return out, None
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    p = toolgym_pack

    def rows(x: torch.Tensor) -> torch.Tensor:  # [1, H, N, D] -> [B, H, L, D], zeros after each row's end
        flat = x[0].transpose(0, 1)  # [N, H, D]
        if p.gather is None:  # each slot holds its own token
            out = flat.new_zeros((p.rows * p.length, *flat.shape[1:])).index_copy(0, p.flat, flat)
        else:  # a shared column reads its owner's token (the backward adds every row's gradient into it)
            out = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))]).index_select(0, p.gather)
        return out.view(p.rows, p.length, *flat.shape[1:]).transpose(1, 2)

    windowed = window is not None and window < p.length  # a window no row reaches changes nothing
    if softcap is not None:  # the model's eager attention with a per-row causal (and windowed) additive mask
        allowed = _row_mask(p, window if windowed else None, query.device)
        additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~allowed, torch.finfo(query.dtype).min
        )  # [1, 1, L, L]
        out, _ = _module_eager(module)(
            module, rows(query), rows(key), rows(value), additive, dropout=dropout, scaling=scaling,
            softcap=softcap, **kwargs,
        )  # fmt: skip
    else:
        # right padding + causal: a real query only sees keys at or before it, all real; padded queries are
        # dropped. A sliding window needs an explicit mask (Mistral, Gemma's local layers).
        mask = _row_mask(p, window, query.device) if windowed else None
        out, _ = sdpa_attention_forward(
            module,
            rows(query),
            rows(key),
            rows(value),
            mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=mask is None,
            **kwargs,
        )  # [B, L, H, D]
    out = out.reshape(p.rows * p.length, *out.shape[2:]).index_select(0, p.flat)  # [N, H, D]
    return out[None], None


def _mask(**kwargs: Any) -> torch.Tensor | None:
    """The padded calls' masks: what SDPA takes, or the additive float mask of an eager attention for
    models that soft-cap attention logits (our attention runs their eager attention then)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    config = kwargs.get("config")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return eager_mask(**kwargs)  # type: ignore[no-any-return]
    return sdpa_mask(**kwargs)  # type: ignore[no-any-return]


def _register() -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTN, _packed_attention)
    AttentionMaskInterface.register(ATTN, _mask)  # padded calls keep sdpa's masks (eager's for soft-capping)


def _set_attn(model: Any, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except Exception:  # transformers without the setter, or one that refuses custom names
        model.config._attn_implementation = name


def attention_mode(model: Any) -> str:
    """``ours`` (toolgym_packed, switched to from sdpa/eager on first use) or ``flash`` (native varlen)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    impl = getattr(base.config, "_attn_implementation", None) or "sdpa"
    if impl == ATTN:
        return "ours"
    if impl in FLASH:
        return "flash"
    _register()
    _set_attn(base, ATTN)
    return "ours"


# decoder families whose packed scoring is checked against the model's own forward (tests/trainers/
# test_packing.py builds each tiny): the head is a linear layer, then what `LogitHead` says
EXACT_FAMILIES = frozenset(
    {
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "cohere",
        "phi3",
        "olmo2",
    }
)


@dataclass(frozen=True)
class LogitHead:
    """What a family's ``ForCausalLM`` does to the LM head's output before returning ``logits``: Granite
    divides by ``logits_scaling``, Cohere multiplies by ``logit_scale``, Gemma2/3 soft-cap with
    ``final_logit_softcapping`` (cap * tanh(logits / cap))."""

    div: float | None = None
    mul: float | None = None
    cap: float | None = None


def logit_head(model: Any) -> LogitHead:
    """The model's logit post-processing, or a ConfigError for a family the packed update does not know
    (its scores could silently differ from the model's own forward: train it with ``packing: off``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = getattr(base.config, "model_type", None)
    if kind not in EXACT_FAMILIES:
        raise ConfigError(
            f"the packed update cannot score model_type {kind!r} exactly (it knows {', '.join(sorted(EXACT_FAMILIES))}: "
            "their LM-head post-processing is checked against the model's own forward); set packing: off"
        )
    c = base.config
    return LogitHead(
        div=getattr(c, "logits_scaling", None) if kind == "granite" else None,
        mul=getattr(c, "logit_scale", None) if kind == "cohere" else None,
        cap=getattr(c, "final_logit_softcapping", None) if kind in ("gemma2", "gemma3_text") else None,
    )


def packing_supported(model: Any) -> bool:
    try:
        logit_head(model)
    except ConfigError:
        return False
    return True


def _score(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, tgt: torch.Tensor, temp: float, ent: bool,
    ent_grad: bool, div: float | None = None, mul: float | None = None, cap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(logp [c], entropy [c] or empty) of one chunk of scored positions: h [c, H], targets [c]; the head's
    post-processing (`LogitHead`) runs in the head's dtype, as the model's own forward does."""
    logits = F.linear(h, w, b)  # [c, V]
    if div is not None:
        logits = logits / div
    if mul is not None:
        logits = logits * mul
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    logits = logits.float() / temp  # [c, V]
    lse = torch.logsumexp(logits, -1)  # [c]
    logp = logits.gather(-1, tgt[:, None]).squeeze(-1) - lse
    if not ent:
        return logp, logp.new_zeros(0)
    with torch.set_grad_enabled(ent_grad and torch.is_grad_enabled()):
        h_ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)  # H = logsumexp - E_p[logit]
    return logp, h_ent


@functools.cache
def compiled_score() -> Any:
    """``_score`` under ``torch.compile`` (dynamic chunk length), built once a process."""
    return torch.compile(_score, dynamic=True)


def packed_forward(
    model: Any,
    batch: TrainBatch,
    temperature: float = 1.0,
    entropy: bool = False,
    value_head: torch.nn.Module | None = None,
    entropy_grad: bool = False,
    chunk: int = 4096,
    share: bool = False,
    compiled: bool = False,
    host: HostMasks | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """(logprobs [B, T], entropy [B, T] or None, None) like ``batch.forward``, on the loss-mask tokens.
    ``share``: run each shared prefix once (``prefix_share``; our attention only, else ignored).
    ``compiled``: the chunk scorer runs compiled (``compiled_score``). ``host``: the masks on the host, so
    that packing does not wait for the GPU (the update loop has them)."""
    if value_head is not None:
        raise ValueError("packed_forward has no value head: use toolgym.trainers.batch.forward")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    post = logit_head(base)
    B, T = batch.input_ids.shape
    mode = attention_mode(model)
    layout = share_layout(batch.input_ids, batch.attention_mask) if share and mode == "ours" else None
    if layout is None:
        ids, pos, row, col, k = pack(batch, host)
        src_at, tgt, at = k - 1, ids[0, k], (row[k], col[k])  # token k is scored by the state before it
        info = PackInfo(row * T + col, B, T)
    else:  # owned tokens only; a scored token reads the state before it wherever that was computed
        ids, pos = batch.input_ids.reshape(-1)[layout.keep][None], (layout.keep % T)[None]  # [1, N']
        scored_at = batch.scored_mask() > 0  # [B, T]
        scored_at[:, 0] = False  # the first column has no state before it
        r, c = scored_at.nonzero().unbind(1)  # [M], [M] every row's scored tokens, shared or not
        src_at, tgt, at = layout.index[r * T + c - 1], batch.input_ids[r, c], (r, c)
        info = PackInfo(layout.keep, B, T, layout.index)
    if mode == "ours":
        # a 4D mask is taken as given (no N x N mask is built); our attention ignores it
        dummy = torch.zeros((1, 1, 1, 1), dtype=torch.bool, device=ids.device)
        out = decoder(
            input_ids=ids, position_ids=pos, attention_mask=dummy, use_cache=False, toolgym_pack=info
        )
    else:  # FlashAttention: transformers reads the packed positions itself
        out = decoder(input_ids=ids, position_ids=pos, use_cache=False)
    hidden = out.last_hidden_state[0]  # [N, H]
    src = hidden[src_at]  # [M, H]
    temp = temperature if temperature > 0 else 1.0
    w, b = head.weight, getattr(head, "bias", None)
    grad = torch.is_grad_enabled()
    score = compiled_score() if compiled else _score
    lps, ents = [], []
    for i in range(0, len(tgt), chunk):
        args = (
            src[i : i + chunk],
            w,
            b,
            tgt[i : i + chunk],
            temp,
            entropy,
            entropy_grad,
            post.div,
            post.mul,
            post.cap,
        )
        lp, en = checkpoint(score, *args, use_reentrant=False) if grad else score(*args)
        lps.append(lp)
        ents.append(en)
    logp = torch.zeros((B, T), device=hidden.device, dtype=torch.float32)
    if lps:
        logp = logp.index_put(at, torch.cat(lps))
    ent = None
    if entropy:
        ent = torch.zeros((B, T), device=hidden.device, dtype=torch.float32)
        if ents:
            ent = ent.index_put(at, torch.cat(ents))
    return logp, ent, None


def use_packing(setting: str, model: Any, device: torch.device, quiet: bool = False) -> bool:
    """Whether the update packs rows: ``on``/``off``; ``auto`` packs on CUDA. A DDP-wrapped model never
    packs (its forward must run through the wrapper); ``on`` then says so on stderr. A model family the
    packed scoring does not know (`logit_head`): ``on`` is a ConfigError, ``auto`` runs the padded update
    and says so."""
    want = setting == "on" or (setting == "auto" and device.type == "cuda")
    if want and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        if setting == "on" and not quiet:
            print("toolgym: packing is off under DDP (the padded update runs)", file=sys.stderr)
        return False
    if want and not packing_supported(model):
        if setting == "on":
            logit_head(model)  # raises, naming the family
        if not quiet:
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            kind = getattr(base.config, "model_type", None)
            print(
                f"toolgym: packing is off for model_type {kind!r} (not checked exact; padded update)",
                file=sys.stderr,
            )
        return False
    return want


def compile_decoder(*models: Any) -> None:
    """``torch.compile`` every decoder layer of each model given (None skipped; shapes are dynamic: packed
    lengths change every micro-batch)."""
    for model in models:
        if model is None:
            continue
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.get_decoder().layers:
            layer.compile(dynamic=True)


def use_compile(setting: str, packing: bool, device: torch.device) -> bool:
    """Whether the update's decoder layers are compiled: never off CUDA; ``on``; ``auto`` with the packed
    update (on an H100 the single-turn GRPO step went 0.81 -> 0.43 s: the eager layers are launch-bound)."""
    return device.type == "cuda" and (setting == "on" or (setting == "auto" and packing))


def use_share(setting: str, packing: bool, device: torch.device) -> bool:
    """Whether the packed update runs shared prefixes once: ``on``/``off``; ``auto`` on CPU only (the update
    there is compute-bound: docs/sft.md; on an H100 with the compiled update it gained nothing, 0.443 vs
    0.434 s a single-turn GRPO step: benchmarks/results/trl_speed.md). Never without packing."""
    return packing and (setting == "on" or (setting == "auto" and device.type == "cpu"))


def update_forward(packing: bool, chunk: int = 4096, share: bool = False, compiled: bool = False) -> Forward:
    """The trainer's forward for the policy, old-logprob and reference passes (``batch.forward`` signature);
    ``share``: shared prefixes once (``prefix_share``); ``compiled``: the chunk scorer compiled (CUDA)."""
    if not packing:
        return forward

    def fwd(
        model: Any, batch: TrainBatch, temperature: float = 1.0, entropy: bool = False,
        value_head: torch.nn.Module | None = None, entropy_grad: bool = False, host: HostMasks | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
        return packed_forward(
            model, batch, temperature, entropy, value_head, entropy_grad, chunk, share, compiled, host
        )

    return fwd
