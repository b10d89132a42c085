"""The engine's scheduler: which sequences hold slots and which run at the next step, and what each sampled
token does to its row.

Sequences wait in ``queue`` for a slot, decode in ``active``, and hold their slot while ``idle`` between turns
(least recently used first out when a newcomer needs one: ``on_evict`` is told). ``schedule`` admits what
fits at a step and splits the newcomers into those prefilled eagerly and those whose few uncached ids run
as extra rows of the decode step; ``record`` appends sampled tokens and ends rows at a stop token, a stop
string, the token allowance or the slot's end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import torch

from toolgym.agents.engine.kv_slots import SlotNumbers
from toolgym.agents.engine.sampling import SampleMode
from toolgym.agents.engine.seq import Seq
from toolgym.errors import ConfigError


class Scheduler:
    def __init__(
        self, cache: SlotNumbers, *, stop_ids: Iterable[int], decode_text: Callable[[Sequence[int]], str] | None,
        prefill_tokens: int, block: int,
    ) -> None:  # fmt: skip
        self.cache = cache
        self.stop_ids = set(int(i) for i in stop_ids)
        self.decode_text = decode_text
        self.prefill_tokens = prefill_tokens  # new tokens one eager prefill pass takes at most
        # steps a queued turn may wait for company while others decode (0: admit at once): a prefill is an
        # eager pass, so newcomers admitted together cost one instead of one each
        self.admit_wait = 0
        # a newcomer with at most this many ids to prefill (an env reply, a fork's last prompt token) runs them
        # as extra rows of the decode step (each row reads its slot up to its own position, so rows of one
        # sequence are causal) instead of an eager prefill pass of ~50 launches a layer; 0: always prefill
        self.inline_prefill = 64
        # new tokens the eager prefill of one step takes at most (0: every admitted prompt whole): a long
        # prompt then prefills in chunks over several steps, each followed by the active rows' decode step,
        # so they do not wait out the whole prefill (chunked prefill; the varlen pass continues a slot's
        # cached prefix, so a chunk is a pass like any other)
        self.prefill_chunk = 0
        # decode steps run back to back between host syncs when nothing waits to join (each step's sampled
        # ids feed the next on the device; the host reads the block once and ends rows at their first stop):
        # a GPU step is then not held up by the host's bookkeeping and a device-to-host sync for every token.
        # A row that stops inside a block computes to the block's end (discarded), so blocks stay short; 1
        # on CPU, where the host waits for every op anyway and the draws then match a step-at-a-time run
        self.block = block
        self.step_no = 0
        self.queue: list[Seq] = []
        self.active: list[Seq] = []
        self.idle: OrderedDict[int, Seq] = OrderedDict()
        self.on_evict: Callable[[Seq], None] | None = None
        self._pieces: dict[int, str] = {}

    # ----- sequence states ---------------------------------------------------------------------------------
    def submit(
        self, seq: Seq, mode: SampleMode, max_new: int, stop: Sequence[str] = (), key: int = 0
    ) -> None:
        if seq.state in ("queued", "active", "released"):
            raise ConfigError(f"cannot submit a sequence that is {seq.state}")
        if not -(1 << 63) <= key < 1 << 63:
            raise ConfigError(f"a sampling key is an int64, not {key}")
        if len(seq.ids) >= self.cache.capacity - 1:
            raise ConfigError(f"a sequence of {len(seq.ids)} tokens does not fit the engine's capacity")
        if seq.state == "idle":
            self.idle.pop(seq.id, None)
        seq.state, seq.mode, seq.max_new, seq.stop = "queued", mode, max(1, max_new), tuple(stop)
        seq.queued_at = self.step_no
        seq.key = key
        seq.out, seq.logprobs, seq.entropies, seq.finish = [], [], [], ""
        self.queue.append(seq)

    def release(self, seq: Seq) -> None:
        if seq.state in ("queued", "active"):
            raise ConfigError("cannot release a sequence while it is generating")
        self.idle.pop(seq.id, None)
        self.drop_slot(seq)
        seq.state = "released"

    def cancel(self, seq: Seq) -> None:
        if seq in self.queue:
            self.queue.remove(seq)
        if seq in self.active:
            self.active.remove(seq)
        seq.state = "new"
        self.release(seq)

    def drop_idle(self) -> None:
        """Every idle sequence loses its cache (stale weights)."""
        for seq in list(self.idle.values()):
            self.drop_slot(seq)
        self.idle.clear()

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    # ----- slots -------------------------------------------------------------------------------------------
    def alloc(self, exclude: Seq | None = None) -> int | None:
        """A free slot, else the least recently used idle sequence's (never ``exclude``'s); None when none."""
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

    def drop_slot(self, seq: Seq) -> None:
        if seq.slot is not None:
            self.cache.release(seq.slot)
        seq.slot, seq.kv = None, 0
        if self.on_evict is not None:
            self.on_evict(seq)

    # ----- a step's rows -----------------------------------------------------------------------------------
    def schedule(self, rows: int) -> tuple[list[Seq], list[Seq]]:
        """Admit what fits: (newcomers to prefill eagerly, newcomers whose uncached ids run as rows of the
        decode step, which takes at most ``rows`` rows)."""
        admitted: list[Seq] = []
        waiting: list[Seq] = []
        self.step_no += 1
        hold = False
        if self.admit_wait > 0 and self.active and self.queue:
            waited = self.step_no - min(s.queued_at for s in self.queue)
            hold = waited <= self.admit_wait and len(self.queue) < max(1, len(self.active) // 2)
        if not hold:  # (held: newcomers gather a few steps while the others decode)
            for seq in self.queue:
                if seq.slot is None:
                    seq.slot = self.alloc()
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
            room = rows - len(self.active) - len(admitted)
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
        return admitted, inline

    def prefill_batches(self, seqs: list[Seq]) -> Iterable[list[Seq]]:
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

    def chunk(self, seqs: list[Seq]) -> list[tuple[Seq, int]]:
        """This step's eager prefill of ``seqs``: (seq, cache up to) within ``prefill_chunk`` new tokens (all
        of them when 0); ``upto == len(seq.ids)``: whole, its first token is sampled. A sequence cut short or
        left out goes back to the front of the queue (with its slot and what is cached) for a later step."""
        for s in seqs:
            s.kv = min(s.kv, len(s.ids) - 1)  # at least the last token runs: its logits start the turn
        if self.prefill_chunk <= 0:
            return [(s, len(s.ids)) for s in seqs]
        budget = self.prefill_chunk
        run: list[tuple[Seq, int]] = []
        later: list[Seq] = []
        for s in seqs:
            n = len(s.ids) - s.kv
            if budget <= 0:
                later.append(s)
            elif n <= budget:
                run.append((s, len(s.ids)))
                budget -= n
            else:  # (kv + budget < len(ids): the last token stays for the pass that samples)
                run.append((s, s.kv + budget))
                later.append(s)
                budget = 0
        self.queue[:0] = later
        return run

    def block_len(self, inline: bool) -> int:
        """Decode steps the next block may take: one when a newcomer runs inline or waits to join (it would
        wait out the block); else no row may pass its token allowance or its slot's end."""
        if inline or self.queue or self.block <= 1:
            return 1
        cap = self.cache.capacity - 1
        k = self.block
        for s in self.active:
            k = min(k, s.max_new - len(s.out), cap - len(s.ids) - len(s.out))
        return max(k, 1)

    def finish(self, done: list[Seq]) -> None:
        """The rows whose turn ended leave the active rows."""
        if done:
            ended = {s.id for s in done}
            self.active = [s for s in self.active if s.id not in ended]

    # ----- sampled tokens ----------------------------------------------------------------------------------
    def record(
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
