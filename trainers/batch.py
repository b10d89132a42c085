"""Training rows -> padded tensors, and the trainer's forward pass (token logprobs, entropies, values).

Token t of a row is scored by the logits at t - 1, so `logprobs[:, t]` is log p(ids[t] | ids[:t]); the
first column (always prompt) is 0. Logprobs use softmax(logits / temperature), the distribution the
engine sampled from (toolgym.agents.SamplingParams), so trainer and engine logprobs are comparable.
The loss mask is never used as the attention mask (TRL#4974): padding has its own mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from toolgym.trainers.tree import Row


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the GPU: a pageable copy to CUDA waits for the work
    queued before it (the update's micro-batch loop would idle the GPU at every index it moves)."""
    if device.type == "cuda" and not t.is_cuda:
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class HostMasks(NamedTuple):
    """A micro-batch's masks on the host, [b, t] each (``TrainBatch``'s): the packed forward finds its tokens
    from these instead of a device ``nonzero()``, which waits for the GPU to finish everything queued."""

    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # the tokens to score: `TrainBatch.scored_mask()`


class TrainBatch(NamedTuple):
    """Padded rows. B rows, T = longest row."""

    input_ids: torch.Tensor  # [B, T] long, right-padded
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] float, 1 on trained model tokens of kept rows
    advantages: torch.Tensor  # [B, T] float
    rollout_logprobs: torch.Tensor  # [B, T] float, engine logprobs (0 off the model tokens)
    turn_ids: torch.Tensor  # [B, T] long, turn index (-1 on prompt and padding)
    rewards: torch.Tensor  # [B] float, leaf reward of each row
    truncated: torch.Tensor  # [B] float, 1 where the episode was cut (turn limit, token budget, timeout)
    # [B, T] float, 1 on every model token of a kept row, where that differs from the loss mask (shared="once":
    # another row trains a shared node); EPO's trajectory entropy reads it, so the forward scores it too
    row_mask: torch.Tensor | None = None

    def select(self, idx: torch.Tensor, length: int | None = None) -> TrainBatch:
        """The rows `idx` (a micro-batch), trimmed to their longest row: `length` when the caller knows it
        (the update loops read the row lengths once per step; measuring here waits for the GPU)."""
        idx = to_device(idx, self.input_ids.device)  # one copy, not one per field
        sub = self.each(lambda t: t[idx])
        T = length if length is not None else int(sub.attention_mask.sum(1).max()) if len(idx) else 0
        return sub.each(lambda t: t[:, :T] if t.dim() == 2 else t)

    def to(self, device: torch.device | str) -> TrainBatch:
        return self.each(lambda t: t.to(device))

    def each(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        """`fn` applied to every field that is set (`row_mask` may be None)."""
        parts: list[Any] = [None if t is None else fn(t) for t in self]
        return TrainBatch(*parts)

    def scored_mask(self) -> torch.Tensor:
        """The tokens a forward must score: the loss mask, and the row mask where there is one. [B, T]."""
        return self.loss_mask if self.row_mask is None else torch.maximum(self.loss_mask, self.row_mask)

    def turn_mask(self) -> torch.Tensor:
        """Every model token of the kept rows (the row mask, else the loss mask). [B, T]."""
        return self.loss_mask if self.row_mask is None else self.row_mask


def collate(
    rows: Sequence[Row],
    advantages: Sequence[Sequence[float]],
    rewards: Sequence[float],
    keep: Sequence[bool],
    pad_id: int,
    truncated: Sequence[bool] | None = None,
    row_masks: Sequence[Sequence[int]] | None = None,
) -> TrainBatch:
    """Pads `rows`; rows with keep False get a zero loss mask (they stay for the batch statistics).
    `row_masks`: every model token of each kept row, where that differs from its loss mask (`TrainBatch`)."""
    # (no rows: every episode of the step was left out, e.g. all truncated with remove_clip; an empty batch
    # that the update skips)
    B, T = len(rows), max((len(r.token_ids) for r in rows), default=1)
    ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
    attn = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    mask = torch.zeros((B, T))  # [B, T]
    adv = torch.zeros((B, T))  # [B, T]
    roll = torch.zeros((B, T))  # [B, T]
    turns = torch.full((B, T), -1, dtype=torch.long)  # [B, T]
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        ids[i, :n] = torch.tensor(r.token_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(r.loss_mask, dtype=torch.float) * float(keep[i])
        adv[i, :n] = torch.tensor(advantages[i], dtype=torch.float)
        roll[i, :n] = torch.tensor(r.logprobs, dtype=torch.float)
        turns[i, :n] = torch.tensor(r.turn_ids)
    cut = torch.tensor([float(x) for x in (truncated or [False] * B)])  # [B]
    full = None
    if row_masks is not None:
        full = torch.zeros((B, T))  # [B, T]
        for i, m in enumerate(row_masks):
            full[i, : len(m)] = torch.tensor(m, dtype=torch.float) * float(keep[i])
    rewards_t = torch.tensor(list(rewards), dtype=torch.float)
    return TrainBatch(ids, attn, mask, adv, roll, turns, rewards_t, cut, full)


def dummy_batch(device: torch.device | str) -> TrainBatch:
    """One two-token row (token 0, in every vocabulary) that scores nothing: all masks and advantages 0. A rank
    with fewer micro-batches than another runs it with a zero loss, so that its forwards and backwards meet
    the other ranks' collectives (trainers/distributed.py, "Uneven ranks")."""
    z = torch.zeros((1, 2))  # [1, 2]
    ids = torch.zeros((1, 2), dtype=torch.long)  # [1, 2]
    b = TrainBatch(
        ids, torch.ones_like(ids), z, z, z, torch.full_like(ids, -1), torch.zeros(1), torch.zeros(1)
    )
    return b.to(device)


def forward(
    model: Any,
    batch: TrainBatch,
    temperature: float = 1.0,
    entropy: bool = False,
    value_head: torch.nn.Module | None = None,
    entropy_grad: bool = False,
    host: HostMasks | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(logprobs [B, T], entropy [B, T] or None, values [B, T + 1] or None), aligned with the tokens.
    (`host`, the packed forward's host copy of the masks, is not needed here.)

    `values[:, t]` is V(first t tokens), the value of the state token t is sampled from; the extra last
    column (and, for a shorter row, the column at its length) is the value after the row's last token:
    the bootstrap of a truncated episode (`final_values`). The entropy carries a gradient only with
    `entropy_grad` (an entropy bonus); otherwise it is a statistic.
    """
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        output_hidden_states=value_head is not None,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float() / (temperature if temperature > 0 else 1.0)  # [B, T-1, V]
    lse = torch.logsumexp(logits, dim=-1)  # [B, T-1]
    target = batch.input_ids[:, 1:]  # [B, T-1]
    logp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse  # [B, T-1]
    logp = torch.nn.functional.pad(logp, (1, 0))  # [B, T]
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(logits, dim=-1)  # [B, T-1, V]
            ent = lse - (probs * logits).sum(-1)  # [B, T-1]  H = logsumexp - E_p[logit]
        ent = torch.nn.functional.pad(ent, (1, 0))  # [B, T]
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1]  # [B, T, H]
        values = value_head(hidden.to(next(value_head.parameters()).dtype)).squeeze(-1).float()  # [B, T]
        values = torch.nn.functional.pad(values, (1, 0))  # [B, T + 1]
    return logp, ent, values


def final_values(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The value after each row's last real token: values [B, T + 1] (from `forward`) -> [B].

    >>> final_values(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), torch.tensor([[1, 1, 0]])).tolist()
    [2.0]
    """
    n = attention_mask.sum(1).long()  # [B]
    return values.gather(1, n[:, None]).squeeze(1)


def micro_batches(
    n_rows: int,
    size: int,
    order: torch.Tensor | None = None,
    lengths: list[int] | None = None,
    tokens: int = 0,
) -> list[torch.Tensor]:
    """Row indices in chunks of `size` (in `order` when given). With each row's token count (`lengths`), the
    rows are sorted longest first before chunking, so that a chunk's rows have similar lengths: its padded
    width (attention, the padded path) then wastes little. Only the grouping changes: a minibatch's gradient
    is the sum over its micro-batches, whichever rows each holds.

    With a token budget (`tokens` > 0, `micro_batch_tokens`; needs `lengths`) `size` is ignored: a chunk takes
    the next rows, longest first, while its padded size (rows x its longest row, its first) stays within
    `tokens`; a row longer than the budget goes alone. The padded size bounds the tokens of either forward
    (the packed one holds only the real ones, at most that).

    >>> [t.tolist() for t in micro_batches(5, 2)]
    [[0, 1], [2, 3], [4]]
    >>> [t.tolist() for t in micro_batches(4, 2, lengths=[3, 9, 1, 8])]
    [[1, 3], [0, 2]]
    >>> [t.tolist() for t in micro_batches(5, 0, lengths=[3, 9, 1, 8, 20], tokens=16)]
    [[4], [1], [3, 0], [2]]
    """
    idx = order if order is not None else torch.arange(n_rows)
    if lengths is not None:
        idx = idx[torch.as_tensor(lengths)[idx].argsort(descending=True, stable=True)]
    if tokens > 0:
        if lengths is None:
            raise ValueError("a token budget needs the rows' lengths")
        return _token_chunks(idx, [lengths[i] for i in idx.tolist()], tokens)
    return [idx[i : i + size] for i in range(0, n_rows, max(size, 1))]  # (size 0: no rows, no chunks)


def _token_chunks(idx: torch.Tensor, sorted_lengths: list[int], tokens: int) -> list[torch.Tensor]:
    """`idx` (sorted longest first; `sorted_lengths` its rows' lengths) cut where the next row would take a
    chunk's padded size past `tokens`."""
    chunks, start = [], 0
    for i in range(1, len(sorted_lengths) + 1):
        if i == len(sorted_lengths) or (i - start + 1) * sorted_lengths[start] > tokens:
            chunks.append(idx[start:i])
            start = i
    return chunks
