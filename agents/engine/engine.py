"""The decode engine: sequences in slots, continuous batching, forks, CUDA-graph decode steps.

A ``Seq`` is a token sequence whose KV lives in one cache slot (``ids[:kv]`` are cached). A turn is
``submit(seq, sampling)``: at the next ``step`` the engine prefills the ids not yet cached (only the new
ones after an env reply: the KV stays across turns) and samples until a stop token, a stop string or the
token allowance. Each ``step`` admits queued sequences while slots are free, runs one decode step for all
active rows, and returns the sequences whose turn ended; their slots stay with them (``idle``) until they
are released or evicted (least recently used first) for a sequence that needs one. So no row ever waits
for another: a row that ends frees its place in the batch at once, and a newcomer joins at the next step.

``fork(seq, ids, shared)`` starts a new sequence whose first ``shared`` positions are copied from ``seq``'s
slot (no prefill). A weight change (``refresh``) drops every idle sequence's cache.

On CUDA the decode step (Triton kernels + sampling) is captured in one CUDA graph per (batch bucket,
sampling mode); padding rows of a bucket write into a scratch slot. On CPU it runs eagerly in plain torch.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from toolgym.agents.engine.cache import KVCache
from toolgym.agents.engine.model import decode_torch, decode_triton, prefill
from toolgym.agents.engine.sampling import SampleMode, sample
from toolgym.agents.engine.weights import PackedWeights
from toolgym.errors import ConfigError

State = Literal["new", "queued", "active", "idle", "released"]


@dataclass(eq=False)
class Seq:
    """One sequence: its ids, its slot, and the turn being generated (``out``/``logprobs``/``entropies``)."""

    id: int
    ids: list[int]
    slot: int | None = None
    kv: int = 0
    state: State = "new"
    mode: SampleMode = field(default_factory=SampleMode)
    max_new: int = 0
    stop: tuple[str, ...] = ()
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: str = ""
    tag: Any = None
    queued_at: int = 0  # the engine step at which the sequence was queued


@dataclass
class EngineStats:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_steps: int = 0
    forked_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    graphs: int = 0


def _buckets(limit: int) -> list[int]:
    out = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]
    out = [b for b in out if b < limit]
    step = 64
    b = 256
    while b < limit:
        b += step
        if b < limit:
            out.append(b)
    return [*out, limit]


class Engine:
    """See the module docstring. ``model`` is a live HF Llama/Qwen2 model (peft allowed); its weights are
    packed into the engine's dtype and re-packed by ``refresh`` when they change."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int = 64,
        capacity: int = 2048,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        stop_ids: Iterable[int] = (),
        decode_text: Callable[[Sequence[int]], str] | None = None,
        cuda_graphs: bool | None = None,
        kernels: bool | None = None,
        prefill_tokens: int = 32768,
    ) -> None:
        if device is None:
            device = next(model.parameters()).device
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.weights = PackedWeights(model, self.device, self.dtype)
        s = self.weights.shape
        self.cache = KVCache(
            s, slots, capacity, self.device, self.dtype, self.weights.inv_freq, self.weights.rope_scale
        )
        if kernels is None:
            kernels = cuda and _has_triton() and s.head_dim % 16 == 0 and s.head_dim <= 256
        self.kernels = bool(kernels)
        self.cuda_graphs = cuda if cuda_graphs is None else bool(cuda_graphs and cuda)
        self.stop_ids = set(int(i) for i in stop_ids)
        self.decode_text = decode_text
        self.prefill_tokens = prefill_tokens
        # steps a queued turn may wait for company while others decode (0: admit at once): a prefill is an
        # eager pass, so newcomers admitted together cost one instead of one each
        self.admit_wait = 0
        self._step_no = 0
        # a newcomer with at most this many ids to prefill (an env reply, a fork's last prompt token) runs them
        # as extra rows of the decode step (each row reads its slot up to its own position, so rows of one
        # sequence are causal) instead of an eager prefill pass of ~50 launches a layer; 0: always prefill
        self.inline_prefill = 64
        # decode steps run back to back between host syncs when nothing waits to join (each step's sampled
        # ids feed the next on the device; the host reads the block once and ends rows at their first stop):
        # a GPU step is then not held up by the host's bookkeeping and a device-to-host sync for every token.
        # A row that stops inside a block computes to the block's end (discarded), so blocks stay short; 1
        # on CPU, where the host waits for every op anyway and the draws then match a step-at-a-time run
        self.block = 8 if cuda else 1
        self.generator = torch.Generator(device=self.device)
        self.generator.seed()
        self.stats = EngineStats()
        self.queue: list[Seq] = []
        self.active: list[Seq] = []
        self.idle: OrderedDict[int, Seq] = OrderedDict()
        self.on_evict: Callable[[Seq], None] | None = None
        self._ids = itertools.count()
        self._pieces: dict[int, str] = {}
        self._graphs: dict[tuple[int, SampleMode], Any] = {}
        self._pool: Any = None
        self.buckets = _buckets(slots)
        if self.cuda_graphs:
            n = self.buckets[-1]
            self._in = torch.zeros((3, n), dtype=torch.long, device=self.device)  # tokens, slots, positions
            self._in_host = torch.zeros((3, n), dtype=torch.long).pin_memory()
            self._out = torch.zeros((n, 3), dtype=torch.float32, device=self.device)
            self._ring = torch.zeros((0, n, 3), dtype=torch.float32, device=self.device)  # a block's steps
            sm = torch.cuda.get_device_properties(self.device).multi_processor_count
            self._sms = sm

    # ----- sequences ---------------------------------------------------------------------------------------
    def new(self, ids: Sequence[int], tag: Any = None) -> Seq:
        """A sequence with nothing cached yet (it gets a slot when it is first submitted)."""
        if not ids:
            raise ConfigError("a sequence needs at least one token")
        return Seq(next(self._ids), list(ids), tag=tag)

    def fork(
        self, src: Seq, ids: Sequence[int] | None = None, shared: int | None = None, tag: Any = None
    ) -> Seq:
        """A new sequence of ``ids`` (default: ``src.ids``) whose first ``shared`` positions (default: all
        that ``src`` has cached and ``ids`` shares) are copied from ``src``'s slot instead of recomputed."""
        return self.fork_many(src, [src.ids if ids is None else ids], tag, shared)[0]

    def fork_many(
        self, src: Seq, ids: Sequence[Sequence[int]], tag: Any = None, shared: int | None = None
    ) -> list[Seq]:
        """``[fork(src, x, shared) for x in ids]``, with the copies into the children's slots as one
        gather/scatter per cache tensor and prefix length instead of two copies a child (a GRPO group's
        samples fork its prompt)."""
        children = [self.new(x, tag) for x in ids]
        if src.slot is None:
            return children
        by_n: dict[int, list[Seq]] = {}
        for child in children:
            n = min(src.kv, len(child.ids) - 1)
            n = n if shared is None else min(shared, n)
            if n > 0:
                by_n.setdefault(n, []).append(child)
        if by_n and src.state == "idle":
            self.idle.move_to_end(src.id)  # recently used: evict it last
        for n, group in by_n.items():
            got = []
            for child in group:
                slot = self._alloc(exclude=src)
                if slot is None:
                    break
                child.slot, child.kv = slot, n
                got.append(slot)
            self.cache.copy_prefix_many(src.slot, got, n)
            self.stats.forked_tokens += n * len(got)
        return children

    def extend(self, seq: Seq, ids: Sequence[int]) -> None:
        """Append ids (an env reply) to an idle sequence; the next turn prefills only these."""
        if seq.state in ("queued", "active"):
            raise ConfigError("cannot extend a sequence while it is generating")
        seq.ids += list(ids)

    def submit(self, seq: Seq, mode: SampleMode, max_new: int, stop: Sequence[str] = ()) -> None:
        """Queue a turn: prefill what is not cached, then sample up to ``max_new`` tokens."""
        if seq.state in ("queued", "active", "released"):
            raise ConfigError(f"cannot submit a sequence that is {seq.state}")
        if len(seq.ids) >= self.cache.capacity - 1:
            raise ConfigError(f"a sequence of {len(seq.ids)} tokens does not fit the engine's capacity")
        if seq.state == "idle":
            self.idle.pop(seq.id, None)
        seq.state, seq.mode, seq.max_new, seq.stop = "queued", mode, max(1, max_new), tuple(stop)
        seq.queued_at = self._step_no
        seq.out, seq.logprobs, seq.entropies, seq.finish = [], [], [], ""
        self.queue.append(seq)

    def release(self, seq: Seq) -> None:
        """Give the sequence's slot back (its cache is gone)."""
        if seq.state in ("queued", "active"):
            raise ConfigError("cannot release a sequence while it is generating")
        self.idle.pop(seq.id, None)
        self._drop_slot(seq)
        seq.state = "released"

    def cancel(self, seq: Seq) -> None:
        """Take a queued or generating sequence out of the batch and release it (an interrupted caller)."""
        if seq in self.queue:
            self.queue.remove(seq)
        if seq in self.active:
            self.active.remove(seq)
        seq.state = "new"
        self.release(seq)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def refresh(self, force: bool = False) -> bool:
        """Re-pack the weights if the live model changed (or ``force``); then every idle cache is stale and
        dropped."""
        changed = self.weights.refresh(force)
        if changed:
            for seq in list(self.idle.values()):
                self._drop_slot(seq)
            self.idle.clear()
        return changed

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def run(self) -> list[Seq]:
        """Step until every queued and active turn has ended; the sequences in the order they ended."""
        done: list[Seq] = []
        while self.busy():
            done += self.step()
        return done

    # ----- one scheduling step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Seq]:
        """Admit what fits, prefill it, run one decode step (a block of ``block`` steps when no newcomer waits);
        returns the sequences whose turn ended."""
        import time

        done: list[Seq] = []
        admitted: list[Seq] = []
        waiting: list[Seq] = []
        self._step_no += 1
        hold = False
        if self.admit_wait > 0 and self.active and self.queue:
            waited = self._step_no - min(s.queued_at for s in self.queue)
            hold = waited <= self.admit_wait and len(self.queue) < max(1, len(self.active) // 2)
        if not hold:  # (held: newcomers gather a few steps while the others decode)
            for seq in self.queue:
                if seq.slot is None:
                    seq.slot = self._alloc()
                    if seq.slot is None:
                        waiting.append(seq)
                        continue
                    seq.kv = 0
                admitted.append(seq)
            self.queue = waiting
        inline: list[Seq] = []
        if admitted and self.inline_prefill > 0:
            # rows one decode step can take: every admitted turn takes at least one (an eagerly prefilled one
            # joins the active rows before the decode step), an inline one n - 1 more
            room = self.buckets[-1] - len(self.active) - len(admitted)
            eager = []
            for s in admitted:
                s.kv = min(s.kv, len(s.ids) - 1)  # at least the last token runs: its logits start the turn
                n = len(s.ids) - s.kv
                if n <= self.inline_prefill and n - 1 <= room:
                    inline.append(s)
                    room -= n - 1
                else:
                    eager.append(s)
            admitted = eager
        if admitted:
            t0 = time.perf_counter()
            for batch in self._prefill_batches(admitted):
                logits = prefill(
                    self.weights,
                    self.cache,
                    [(s.slot, s.kv, s.ids[s.kv :]) for s in batch],  # type: ignore[misc]
                )
                assert logits is not None
                self.stats.prefill_tokens += sum(len(s.ids) - s.kv for s in batch)
                for s in batch:
                    s.kv = len(s.ids)
                for mode, rows in _by_mode(batch):
                    idx = torch.tensor(rows, device=self.device)
                    tok, lp, ent = sample(logits[idx], mode, self.generator)
                    done += self._record(
                        [batch[r] for r in rows], tok[None], lp[None], ent[None] if ent is not None else None
                    )
            self._sync()
            self.stats.prefill_s += time.perf_counter() - t0
        if self.active or inline:
            t0 = time.perf_counter()
            # a block of steps only when no newcomer waits to join (it would wait out the block)
            k = 1 if inline or self.queue or self.block <= 1 else self._block_len(self.active)
            for mode, group, extra in _mode_groups(self.active, inline):
                done += self._decode(group, mode, extra, k)
            self.stats.decode_steps += k
            self.stats.decode_s += time.perf_counter() - t0
        if done:
            ended = {s.id for s in done}
            self.active = [s for s in self.active if s.id not in ended]
        return done

    def _prefill_batches(self, seqs: list[Seq]) -> Iterable[list[Seq]]:
        """Turn prefill runs in rounds of at most ``prefill_tokens`` new tokens (a long prompt runs alone)."""
        for s in seqs:
            s.kv = min(s.kv, len(s.ids) - 1)  # at least the last token runs: its logits start the turn
        batch: list[Seq] = []
        total = 0
        for s in sorted(seqs, key=lambda q: len(q.ids) - q.kv):
            n = len(s.ids) - s.kv
            if batch and total + n > self.prefill_tokens:
                yield batch
                batch, total = [], 0
            batch.append(s)
            total += n
        if batch:
            yield batch

    def prefill_only(self, seqs: Sequence[Seq], upto: Sequence[int]) -> None:
        """Cache ``seq.ids[:upto]`` for each sequence without sampling (a shared prefix before forks)."""
        todo = []
        for s, n in zip(seqs, upto, strict=True):
            if s.slot is None:
                s.slot = self._alloc()
                s.kv = 0
            if s.slot is not None and n > s.kv:
                todo.append((s, n))
        with torch.no_grad():
            for i in range(0, len(todo), 64):
                part = todo[i : i + 64]
                prefill(self.weights, self.cache, [(s.slot, s.kv, s.ids[s.kv : n]) for s, n in part], False)  # type: ignore[misc]
                for s, n in part:
                    self.stats.prefill_tokens += n - s.kv
                    s.kv = n

    def _block_len(self, rows: list[Seq]) -> int:
        """Decode steps the next block may take: no row may pass its token allowance or its slot's end."""
        cap = self.cache.capacity - 1
        k = self.block
        for s in rows:
            k = min(k, s.max_new - len(s.out), cap - len(s.ids) - len(s.out))
        return max(k, 1)

    def _decode(self, rows: list[Seq], mode: SampleMode, inline: Sequence[Seq] = (), k: int = 1) -> list[Seq]:
        """``k`` decode steps for ``rows`` (each step's ids feed the next on the device); ``inline``
        newcomers (only with ``k == 1``) run their uncached ids as extra rows (their last row samples their
        first token)."""
        tokens = [s.out[-1] for s in rows]
        slots = [s.slot for s in rows]
        pos = [len(s.ids) + len(s.out) - 1 for s in rows]
        last = []
        for s in inline:
            new = s.ids[s.kv :]
            tokens += new
            slots += [s.slot] * len(new)
            pos += range(s.kv, len(s.ids))
            last.append(len(tokens) - 1)
        self.stats.decode_tokens += len(rows) * k
        tok, lp, ent = self._run_rows(tokens, slots, pos, mode, k)  # type: ignore[arg-type]
        n = len(rows)
        done = (
            self._record(rows, tok[:, :n], lp[:, :n], ent[:, :n] if ent is not None else None) if rows else []
        )
        if inline:
            idx = torch.tensor(last, device=tok.device)
            for s in inline:
                self.stats.prefill_tokens += len(s.ids) - s.kv
                s.kv = len(s.ids)
            done += self._record(
                list(inline), tok[:, idx], lp[:, idx], ent[:, idx] if ent is not None else None
            )
        return done

    def _run_rows(
        self, tokens: list[int], slots: list[int], pos: list[int], mode: SampleMode, k: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens, logprobs, entropies or None), each ``[k, rows]`` on the host: ``k`` decode steps after one
        token per row, each step's samples fed to the next (the graph of the row count's bucket replayed
        ``k`` times on CUDA, eager otherwise); read with one sync."""
        n = len(tokens)
        if n > self.buckets[-1]:  # checked on every device: CPU tests guard the CUDA graphs' largest bucket
            raise RuntimeError(f"a decode step of {n} rows exceeds the engine's {self.buckets[-1]}")
        if self.cuda_graphs:
            b = next(x for x in self.buckets if x >= n)
            self._in_host[0, :n] = torch.tensor(tokens)
            self._in_host[1, :n] = torch.tensor(slots)
            self._in_host[2, :n] = torch.tensor(pos)
            self._in_host[0, n:b] = 0
            self._in_host[1, n:b] = self.cache.scratch
            self._in_host[2, n:b] = 0
            self._in[:, :b].copy_(self._in_host[:, :b], non_blocking=True)
            graph = self._graphs.get((b, mode))
            if graph is None:
                graph = self._graphs[(b, mode)] = self._capture(b, mode)
                self._in[:, :b].copy_(self._in_host[:, :b], non_blocking=True)
            if k == 1:
                graph.replay()
                out = self._out[:n].cpu()[None]  # [1, n, 3] the one sync of a step
            else:
                if self._ring.shape[0] < k:
                    self._ring = torch.zeros((k, *self._out.shape), dtype=torch.float32, device=self.device)
                for i in range(k):  # the graph feeds its samples (and positions + 1) to its own next replay
                    graph.replay()
                    self._ring[i, :n].copy_(self._out[:n])
                out = self._ring[:k, :n].cpu()  # [k, n, 3] the one sync of a block
            return out[..., 0].long(), out[..., 1], out[..., 2] if mode.entropies else None
        t = torch.tensor(tokens, device=self.device)
        sl = torch.tensor(slots, device=self.device)
        ps = torch.tensor(pos, device=self.device)
        span = max(pos) + 1
        toks, lps, ents = [], [], []
        for i in range(k):
            if self.kernels:
                logits = decode_triton(self.weights, self.cache, t, sl, ps, self._nsplit(n))
            else:
                logits = decode_torch(self.weights, self.cache, t, sl, ps, span=span + i)
            t, lp, ent = sample(logits, mode, self.generator)
            toks.append(t)
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
            ps = ps + 1
        if k == 1:  # (views, not copies: the usual step)
            return toks[0][None], lps[0][None], ents[0][None] if ents else None
        return torch.stack(toks), torch.stack(lps), torch.stack(ents) if ents else None

    def _nsplit(self, b: int) -> int:
        """Time splits of the decode attention: enough programs to fill the GPU when rows are few."""
        if self.device.type != "cuda":
            return 1
        sms = getattr(self, "_sms", 132)
        want = -(-2 * sms // (b * self.weights.shape.kv_heads))
        most = max(1, self.cache.capacity // 128)
        n = 1
        while n < min(want, most):
            n *= 2
        return n

    def _body(self, b: int, mode: SampleMode) -> None:
        tok, sl, ps = self._in[0, :b], self._in[1, :b], self._in[2, :b]
        if self.kernels:
            logits = decode_triton(self.weights, self.cache, tok, sl, ps, self._nsplit(b))
        else:
            logits = decode_torch(self.weights, self.cache, tok, sl, ps)
        t, lp, ent = sample(logits, mode, self.generator)
        self._out[:b, 0] = t.float()
        self._out[:b, 1] = lp
        if ent is not None:
            self._out[:b, 2] = ent
        # the next replay of a block continues every row (the host restages the inputs otherwise)
        self._in[0, :b] = t
        self._in[2, :b] += 1

    def _capture(self, b: int, mode: SampleMode) -> Any:
        """A CUDA graph of one decode step for ``b`` rows (warm-up and capture write to the scratch slot)."""
        self._in[0, :b] = 0
        self._in[1, :b] = self.cache.scratch
        self._in[2, :b] = 0
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._body(b, mode)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if hasattr(graph, "register_generator_state"):
            graph.register_generator_state(self.generator)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            self._body(b, mode)
        self.stats.graphs += 1
        return graph

    def _record(
        self, rows: list[Seq], tok: torch.Tensor, lp: torch.Tensor, ent: torch.Tensor | None
    ) -> list[Seq]:
        """Append each row's sampled tokens (``[k, rows]``: a block's steps in order) up to its first stop or
        its allowance, where the row ends (its later samples in the block are dropped)."""
        done: list[Seq] = []
        cap = self.cache.capacity - 1
        if tok.shape[0] == 1:  # one step (the CPU default): no per-row lists
            toks1, lps1 = tok[0].tolist(), lp[0].tolist()
            ents1 = ent[0].tolist() if ent is not None else None
            for j, s in enumerate(rows):
                self._take(s, toks1[j], lps1[j], ents1[j] if ents1 is not None else None, cap)
                self._settle(s, done)
            return done
        toks, lps = tok.T.tolist(), lp.T.tolist()  # [rows][k]
        ents = ent.T.tolist() if ent is not None else None
        for j, s in enumerate(rows):
            row = toks[j]
            if (
                not s.stop
                and self.stop_ids.isdisjoint(row)
                and len(s.out) + len(row) < min(s.max_new, cap - len(s.ids))
            ):  # nothing in the block can end the row: take it whole
                s.out += row
                s.logprobs += lps[j]
                if ents is not None:
                    s.entropies += ents[j]
                row = []
            for i, t in enumerate(row):
                if self._take(s, t, lps[j][i], ents[j][i] if ents is not None else None, cap):
                    break
            self._settle(s, done)
        return done

    def _take(self, s: Seq, t: int, lp: float, ent: float | None, cap: int) -> bool:
        """Append one sampled token to ``s``; True when it ends the turn (a stop, the allowance, the slot)."""
        s.out.append(t)
        s.logprobs.append(lp)
        if ent is not None:
            s.entropies.append(ent)
        if t in self.stop_ids or (s.stop and self._hit_stop(s, t)):
            s.finish = "stop"
        elif len(s.out) >= s.max_new or len(s.ids) + len(s.out) >= cap:
            s.finish = "length"
        return bool(s.finish)

    def _settle(self, s: Seq, done: list[Seq]) -> None:
        """A row whose turn ended goes idle (into ``done``); a newcomer that goes on joins the active rows."""
        if s.finish:
            s.ids += s.out
            s.kv = len(s.ids) - 1  # the last sampled token was never fed
            s.state = "idle"
            self.idle[s.id] = s
            done.append(s)
        elif s.state != "active":
            s.state = "active"
            self.active.append(s)

    def _hit_stop(self, s: Seq, t: int) -> bool:
        piece = self._pieces.get(t)
        if piece is None:
            assert self.decode_text is not None
            piece = self._pieces[t] = self.decode_text([t])
        if not any(st[-1] in piece for st in s.stop) and "\ufffd" not in piece:
            return False  # the stop strings can only complete on a token holding their last character
        assert self.decode_text is not None
        tail = self.decode_text(s.out[-24:])
        return any(st in tail for st in s.stop)

    # ----- slots -------------------------------------------------------------------------------------------
    def _alloc(self, exclude: Seq | None = None) -> int | None:
        slot = self.cache.alloc()
        if slot is not None:
            return slot
        for victim in list(self.idle.values()):  # least recently used first
            if victim is exclude:
                continue
            self.idle.pop(victim.id)
            slot = victim.slot
            victim.slot, victim.kv = None, 0
            if self.on_evict is not None:
                self.on_evict(victim)
            return slot
        return None

    def _drop_slot(self, seq: Seq) -> None:
        if seq.slot is not None:
            self.cache.release(seq.slot)
        seq.slot, seq.kv = None, 0
        if self.on_evict is not None:
            self.on_evict(seq)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _mode_groups(active: list[Seq], inline: list[Seq]) -> list[tuple[SampleMode, list[Seq], list[Seq]]]:
    """(mode, active rows, inline rows) per sampling mode; one mode (one object) in the common case."""
    first = active[0].mode if active else inline[0].mode
    if all(s.mode is first for s in active) and all(s.mode is first for s in inline):
        return [(first, list(active), list(inline))]
    modes = dict.fromkeys([s.mode for s in active] + [s.mode for s in inline])
    return [(m, [s for s in active if s.mode == m], [s for s in inline if s.mode == m]) for m in modes]


def _by_mode(seqs: Sequence[Seq]) -> list[tuple[SampleMode, list[int]]]:
    groups: dict[SampleMode, list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault(s.mode, []).append(i)
    return list(groups.items())


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
