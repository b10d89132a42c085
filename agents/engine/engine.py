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

The work is split three ways: the ``Scheduler`` (scheduler.py) decides which sequences hold slots and run,
and what each sampled token does to its row; the ``ModelRunner`` holds the weights and the cache and runs
the prefill and decode passes; the ``Engine`` is the sequence-level API, and its ``step`` joins the two.

On CUDA the decode step (Triton kernels + sampling) is captured in one CUDA graph per (batch bucket,
sampling mode, keyed or not); padding rows of a bucket write into a scratch slot. A turn submitted with a
``key`` (a request's seed) draws its sampling noise from a hash of (key, position) instead of the engine's
generator (sampling.py): the same tokens whichever rows share its batch; a step with no keyed row runs
the unkeyed graph (no hashing). On CPU it runs eagerly in plain torch.
The eager prefill is varlen (packed, no padding; Triton kernels on CUDA) unless ``prefill="padded"`` (or
``TOOLGYM_PREFILL=padded``) selects the earlier padded pass for A/B runs (model.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from toolgym.agents.engine.kv_slots import KVCache
from toolgym.agents.engine.model import decode_torch, decode_triton, prefill, prefill_mode
from toolgym.agents.engine.sampling import SampleMode, sample
from toolgym.agents.engine.scheduler import Scheduler
from toolgym.agents.engine.seq import EngineStats, Seq, State
from toolgym.agents.engine.weights import PackedWeights
from toolgym.errors import ConfigError

__all__ = ["Engine", "EngineStats", "ModelRunner", "Seq", "State"]


Sampled = tuple[list[Seq], torch.Tensor, torch.Tensor, torch.Tensor | None]  # rows, [k, rows] x 3


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


class ModelRunner:
    """``model`` (a live HF Llama/Qwen2 model) packed into ``dtype`` on ``device``, with a cache of ``slots``
    sequences of ``capacity`` tokens."""

    def __init__(
        self, model: Any, *, slots: int, capacity: int, device: torch.device, dtype: torch.dtype,
        cuda_graphs: bool | None, kernels: bool | None, stats: EngineStats, prefill: str | None = None,
    ) -> None:  # fmt: skip
        self.device = device
        self.prefill_mode = prefill_mode(prefill)  # "varlen" or "padded" (model.py)
        cuda = device.type == "cuda"
        self.dtype = dtype
        self.weights = PackedWeights(model, device, dtype)
        s = self.weights.shape
        self.cache = KVCache(
            s, slots, capacity, device, dtype, self.weights.inv_freq, self.weights.rope_scale
        )
        if kernels is None:
            kernels = cuda and _has_triton() and kernels_fit(s.head_dim)
        self.kernels = bool(kernels)
        self.cuda_graphs = cuda if cuda_graphs is None else bool(cuda_graphs and cuda)
        self.generator = torch.Generator(device=device)
        self.generator.seed()
        self.stats = stats
        self._graphs: dict[tuple[int, SampleMode], Any] = {}
        self._keyed_graphs: dict[tuple[int, SampleMode], Any] = {}  # steps with keyed rows: the race hashed
        # False: a decode step whose (bucket, mode) has no graph yet runs eager instead of capturing one (an
        # asynchronous run's learner engine: a capture while the worker thread's kernels run would fail)
        self.capture_new = True
        self._pool: Any = None
        self.buckets = _buckets(slots)
        if self.cuda_graphs:
            n = self.buckets[-1]
            # tokens, slots, positions, keys (0: the generator's noise)
            self._in = torch.zeros((4, n), dtype=torch.long, device=device)
            self._in_host = torch.zeros((4, n), dtype=torch.long).pin_memory()
            self._out = torch.zeros((n, 3), dtype=torch.float32, device=device)
            self._ring = torch.zeros((0, n, 3), dtype=torch.float32, device=device)  # a block's steps
            self._sms = torch.cuda.get_device_properties(device).multi_processor_count

    def prefill(self, batch: list[Seq]) -> Iterator[Sampled]:
        """Run each sequence's uncached ids into its slot, then sample its first token: (rows, tokens,
        logprobs, entropies or None) per sampling mode, each ``[1, rows]``."""
        seqs = [(s.slot, s.kv, s.ids[s.kv :]) for s in batch]
        logits = prefill(self.weights, self.cache, seqs, mode=self.prefill_mode, kernels=self.kernels)  # type: ignore[arg-type]
        assert logits is not None
        self.stats.prefill_tokens += sum(len(s.ids) - s.kv for s in batch)
        for s in batch:
            s.kv = len(s.ids)
        groups: dict[SampleMode, list[int]] = {}
        for i, s in enumerate(batch):
            groups.setdefault(s.mode, []).append(i)
        for mode, rows in groups.items():
            # (a blocking copy would wait for the pass: the host could not build the next one meanwhile)
            part = (
                logits if len(groups) == 1 else logits[torch.tensor(rows).to(self.device, non_blocking=True)]
            )
            keys = [batch[r].key for r in rows]
            kt = pt = None
            if any(keys):  # the drawn token goes at position len(ids) (the last prompt token's is len - 1)
                at = [len(batch[r].ids) for r in rows]
                kt, pt = torch.tensor([keys, at]).to(self.device, non_blocking=True)
            tok, lp, ent = sample(part, mode, self.generator, kt, pt)
            yield [batch[r] for r in rows], tok[None], lp[None], ent[None] if ent is not None else None

    def cache_only(self, todo: list[tuple[Seq, int]]) -> None:
        """Cache ``seq.ids[:n]`` for each (seq, n) without sampling, 64 sequences a pass."""
        for i in range(0, len(todo), 64):
            part = todo[i : i + 64]
            seqs = [(s.slot, s.kv, s.ids[s.kv : n]) for s, n in part]
            prefill(self.weights, self.cache, seqs, False, mode=self.prefill_mode, kernels=self.kernels)  # type: ignore[arg-type]
            for s, n in part:
                self.stats.prefill_tokens += n - s.kv
                s.kv = n

    def run_rows(
        self, tokens: list[int], slots: list[int], pos: list[int], mode: SampleMode, k: int = 1,
        keys: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """(tokens, logprobs, entropies or None), each ``[k, rows]`` on the host: ``k`` decode steps after one
        token per row, each step's samples fed to the next (the graph of the row count's bucket replayed
        ``k`` times on CUDA, eager otherwise); read with one sync. ``keys``: each row's sampling key (0: the
        generator's noise; None: no row has one)."""
        n = len(tokens)
        if n > self.buckets[-1]:  # checked on every device: CPU tests guard the CUDA graphs' largest bucket
            raise RuntimeError(f"a decode step of {n} rows exceeds the engine's {self.buckets[-1]}")
        b = next(x for x in self.buckets if x >= n)
        keyed = keys is not None
        graphs = self._keyed_graphs if keyed else self._graphs
        if self.cuda_graphs and (self.capture_new or (b, mode) in graphs):
            self._in_host[0, :n] = torch.tensor(tokens)
            self._in_host[1, :n] = torch.tensor(slots)
            self._in_host[2, :n] = torch.tensor(pos)
            self._in_host[3, :n] = torch.tensor(keys) if keys is not None else 0
            self._in_host[0, n:b] = 0
            self._in_host[1, n:b] = self.cache.scratch
            self._in_host[2, n:b] = 0
            self._in_host[3, n:b] = 0
            self._in[:, :b].copy_(self._in_host[:, :b], non_blocking=True)
            graph = graphs.get((b, mode))
            if graph is None:
                graph = graphs[(b, mode)] = self._capture(b, mode, keyed)
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
        kt = torch.tensor(keys, device=self.device) if keys is not None else None
        span = max(pos) + 1
        toks, lps, ents = [], [], []
        for i in range(k):
            if self.kernels:
                logits = decode_triton(self.weights, self.cache, t, sl, ps, self.nsplit(n))
            else:
                logits = decode_torch(self.weights, self.cache, t, sl, ps, span=span + i)
            # (the drawn token goes at the next position)
            t, lp, ent = sample(logits, mode, self.generator, kt, ps + 1 if kt is not None else None)
            toks.append(t)
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
            ps = ps + 1
        if k == 1:  # (views, not copies: the usual step)
            return toks[0][None], lps[0][None], ents[0][None] if ents else None
        return torch.stack(toks), torch.stack(lps), torch.stack(ents) if ents else None

    def nsplit(self, b: int) -> int:
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

    def _body(self, b: int, mode: SampleMode, keyed: bool = False) -> None:
        tok, sl, ps = self._in[0, :b], self._in[1, :b], self._in[2, :b]
        if self.kernels:
            logits = decode_triton(self.weights, self.cache, tok, sl, ps, self.nsplit(b))
        else:
            logits = decode_torch(self.weights, self.cache, tok, sl, ps)
        keys, at = (self._in[3, :b], ps + 1) if keyed else (None, None)
        t, lp, ent = sample(logits, mode, self.generator, keys, at)
        self._out[:b, 0] = t.float()
        self._out[:b, 1] = lp
        if ent is not None:
            self._out[:b, 2] = ent
        # the next replay of a block continues every row (the host restages the inputs otherwise)
        self._in[0, :b] = t
        self._in[2, :b] += 1

    def _capture(self, b: int, mode: SampleMode, keyed: bool = False) -> Any:
        """A CUDA graph of one decode step for ``b`` rows (warm-up and capture write to the scratch slot);
        ``keyed``: its rows' keys (``_in[3]``) pick their sampling noise."""
        self._in[0, :b] = 0
        self._in[1, :b] = self.cache.scratch
        self._in[2, :b] = 0
        self._in[3, :b] = 0
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._body(b, mode, keyed)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if hasattr(graph, "register_generator_state"):
            graph.register_generator_state(self.generator)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            self._body(b, mode, keyed)
        self.stats.graphs += 1
        return graph

    def sync(self) -> None:
        # this stream only, never the whole device: in an asynchronous run the learner's update runs on the same
        # GPU (a device-wide wait would wait for it), and a rollout rank may hold a posted NCCL receive
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


class _Part:
    """An engine attribute kept by one of its parts (``scheduler`` or ``runner``), read and set through."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class Engine:
    """See the module docstring. ``model`` is a live HF Llama/Qwen2 model (peft allowed); its weights are
    packed into the engine's dtype and re-packed by ``refresh`` when they change."""

    # the scheduler's: sequences by state, admission and block settings, stop tokens, eviction hook
    queue = _Part("scheduler")
    active = _Part("scheduler")
    idle = _Part("scheduler")
    admit_wait = _Part("scheduler")
    inline_prefill = _Part("scheduler")
    prefill_chunk = _Part("scheduler")
    block = _Part("scheduler")
    prefill_tokens = _Part("scheduler")
    stop_ids = _Part("scheduler")
    decode_text = _Part("scheduler")
    on_evict = _Part("scheduler")
    # the model runner's: weights, cache, device, sampling generator, decode paths
    weights = _Part("runner")
    cache = _Part("runner")
    device = _Part("runner")
    dtype = _Part("runner")
    generator = _Part("runner")
    kernels = _Part("runner")
    prefill_mode = _Part("runner")
    cuda_graphs = _Part("runner")
    buckets = _Part("runner")

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
        prefill: str | None = None,
    ) -> None:
        dev = torch.device(device if device is not None else next(model.parameters()).device)
        cuda = dev.type == "cuda"
        self.stats = EngineStats()
        self.runner = ModelRunner(
            model, slots=slots, capacity=capacity, device=dev,
            dtype=dtype or (torch.bfloat16 if cuda else torch.float32), cuda_graphs=cuda_graphs,
            kernels=kernels, stats=self.stats, prefill=prefill,
        )  # fmt: skip
        self.scheduler = Scheduler(
            self.runner.cache, stop_ids=stop_ids, decode_text=decode_text, prefill_tokens=prefill_tokens,
            block=8 if cuda else 1,
        )  # fmt: skip
        self._ids = itertools.count()

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
            n = _common_len(src.ids, child.ids, n)  # only positions whose ids match: the rest is prefilled
            if n > 0:
                by_n.setdefault(n, []).append(child)
        if by_n and src.state == "idle":
            self.idle.move_to_end(src.id)  # recently used: evict it last
        for n, group in by_n.items():
            got = []
            for child in group:
                slot = self.scheduler.alloc(exclude=src)
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

    def submit(
        self, seq: Seq, mode: SampleMode, max_new: int, stop: Sequence[str] = (), key: int = 0
    ) -> None:
        """Queue a turn: prefill what is not cached, then sample up to ``max_new`` tokens. ``key`` (a nonzero
        int64, e.g. ``sampling.request_key(seed)``): the turn's sampling noise is a hash of (key, position),
        the same whatever else runs; 0: the engine's generator."""
        self.scheduler.submit(seq, mode, max_new, stop, key)

    def release(self, seq: Seq) -> None:
        """Give the sequence's slot back (its cache is gone)."""
        self.scheduler.release(seq)

    def cancel(self, seq: Seq) -> None:
        """Take a queued or generating sequence out of the batch and release it (an interrupted caller)."""
        self.scheduler.cancel(seq)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def refresh(self, force: bool = False) -> bool:
        """Re-pack the weights if the live model changed (or ``force``); then every idle cache is stale and
        dropped."""
        changed = self.weights.refresh(force)
        if changed:
            self.scheduler.drop_idle()
        return changed

    def busy(self) -> bool:
        return self.scheduler.busy()

    def run(self) -> list[Seq]:
        """Step until every queued and active turn has ended; the sequences in the order they ended."""
        done: list[Seq] = []
        while self.busy():
            done += self.step()
        return done

    def prefill_only(self, seqs: Sequence[Seq], upto: Sequence[int]) -> None:
        """Cache ``seq.ids[:upto]`` for each sequence without sampling (a shared prefix before forks)."""
        todo = []
        for s, n in zip(seqs, upto, strict=True):
            if s.slot is None:
                s.slot = self.scheduler.alloc()
                s.kv = 0
            if s.slot is not None and n > s.kv:
                todo.append((s, n))
        with torch.no_grad():
            self.runner.cache_only(todo)

    # ----- one scheduling step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Seq]:
        """Admit what fits, prefill it, run one decode step (a block of ``block`` steps when no newcomer waits);
        returns the sequences whose turn ended."""
        eager, inline = self.scheduler.schedule(self.buckets[-1])
        done = self._prefill(eager) if eager else []
        if self.active or inline:
            done += self._decode_step(inline)
        self.scheduler.finish(done)
        return done

    def _prefill(self, admitted: list[Seq]) -> list[Seq]:
        """Eager prefill passes for ``admitted`` newcomers, each sampling its first token."""
        t0 = time.perf_counter()
        done: list[Seq] = []
        # every pass is launched before the first samples are read (a host sync): the host builds the next
        # pass's indices while the device runs the last one
        todo = self.scheduler.chunk(admitted)
        part = [(s, n) for s, n in todo if n < len(s.ids)]  # chunks of prompts that go on at a later step
        if part:
            self.runner.cache_only(part)
        whole = [s for s, n in todo if n == len(s.ids)]
        sampled = [
            out for batch in self.scheduler.prefill_batches(whole) for out in self.runner.prefill(batch)
        ]
        for rows, tok, lp, ent in sampled:
            done += self.scheduler.record(rows, tok, lp, ent)
        self.runner.sync()
        self.stats.prefill_s += time.perf_counter() - t0
        return done

    def _decode_step(self, inline: list[Seq]) -> list[Seq]:
        """One decode step (or a block of them) for the active rows and the ``inline`` newcomers."""
        t0 = time.perf_counter()
        k = self.scheduler.block_len(bool(inline))
        done: list[Seq] = []
        for mode, group, extra in _mode_groups(self.active, inline):
            done += self._decode(group, mode, extra, k)
        self.stats.decode_steps += k
        self.stats.decode_s += time.perf_counter() - t0
        return done

    def _decode(self, rows: list[Seq], mode: SampleMode, inline: Sequence[Seq] = (), k: int = 1) -> list[Seq]:
        """``k`` decode steps for ``rows`` (each step's ids feed the next on the device); ``inline``
        newcomers (only with ``k == 1``) run their uncached ids as extra rows (their last row samples their
        first token)."""
        tokens = [s.out[-1] for s in rows]
        slots = [s.slot for s in rows]
        pos = [len(s.ids) + len(s.out) - 1 for s in rows]
        keys = [s.key for s in rows]
        last = []
        for s in inline:
            new = s.ids[s.kv :]
            tokens += new
            slots += [s.slot] * len(new)
            pos += range(s.kv, len(s.ids))
            keys += [s.key] * len(new)
            last.append(len(tokens) - 1)
        self.stats.decode_tokens += len(rows) * k
        tok, lp, ent = self._run_rows(tokens, slots, pos, mode, k, keys if any(keys) else None)  # type: ignore[arg-type]
        n = len(rows)
        record = self.scheduler.record
        done = record(rows, tok[:, :n], lp[:, :n], ent[:, :n] if ent is not None else None) if rows else []
        if inline:
            idx = torch.tensor(last, device=tok.device)
            for s in inline:
                self.stats.prefill_tokens += len(s.ids) - s.kv
                s.kv = len(s.ids)
            done += record(list(inline), tok[:, idx], lp[:, idx], ent[:, idx] if ent is not None else None)
        return done

    def _run_rows(
        self, tokens: list[int], slots: list[int], pos: list[int], mode: SampleMode, k: int = 1,
        keys: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """``ModelRunner.run_rows``: ``k`` decode steps over these rows, read from the device once."""
        return self.runner.run_rows(tokens, slots, pos, mode, k, keys)

    def _nsplit(self, b: int) -> int:
        return self.runner.nsplit(b)


def _mode_groups(active: list[Seq], inline: list[Seq]) -> list[tuple[SampleMode, list[Seq], list[Seq]]]:
    """(mode, active rows, inline rows) per sampling mode; one mode (one object) in the common case."""
    first = active[0].mode if active else inline[0].mode
    if all(s.mode is first for s in active) and all(s.mode is first for s in inline):
        return [(first, list(active), list(inline))]
    modes = dict.fromkeys([s.mode for s in active] + [s.mode for s in inline])
    return [(m, [s for s in active if s.mode == m], [s for s in inline if s.mode == m]) for m in modes]


def _common_len(a: list[int], b: list[int], n: int) -> int:
    """How many of the first ``n`` ids ``a`` and ``b`` share (one list comparison when all of them)."""
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def kernels_fit(head_dim: int) -> bool:
    """Whether the Triton kernels take this head size: they index a head with ``tl.arange(0, D)`` (a power of
    two) in tiles of at least 16 (an 80- or 96-wide head, e.g., runs the torch path instead of failing)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
