"""The engine's scheduler alone (agents/engine/scheduler.py), over a cache of slot numbers: admission,
inline prefill rows, least-recently-used eviction, block lengths and where sampled tokens end a row."""

from __future__ import annotations

import torch

from toolgym.agents.engine.kv_slots import SlotNumbers
from toolgym.agents.engine.sampling import SampleMode
from toolgym.agents.engine.scheduler import Scheduler
from toolgym.agents.engine.seq import Seq

GREEDY = SampleMode(temperature=0)


def make(slots: int = 2, capacity: int = 64, block: int = 1) -> Scheduler:
    cache = SlotNumbers(slots, capacity)  # the KV cache less its tensors
    return Scheduler(cache, stop_ids=[0], decode_text=None, prefill_tokens=100, block=block)


def test_admission_takes_free_slots_and_splits_inline_rows_from_eager_prefills() -> None:
    sch = make(slots=2, capacity=128)
    short, long, late = Seq(0, [1, 2, 3]), Seq(1, list(range(1, 71))), Seq(2, [4, 5])
    for s in (short, long, late):
        sch.submit(s, GREEDY, 4)
    eager, inline = sch.schedule(rows=8)
    # two slots: the third waits; 3 uncached ids run as rows of the decode step, 70 > 64 prefill eagerly
    assert (eager, inline, sch.queue) == ([long], [short], [late])
    assert (short.slot, long.slot, late.slot) == (0, 1, None)


def test_inline_rows_are_bounded_by_the_decode_step() -> None:
    sch = make(slots=3)
    a, b = Seq(0, list(range(1, 7))), Seq(1, list(range(1, 7)))
    sch.submit(a, GREEDY, 4)
    sch.submit(b, GREEDY, 4)
    eager, inline = sch.schedule(rows=8)
    # rows: 8 - 2 admitted = 6 extra; a takes 5 more rows (6 ids), b's 5 no longer fit
    assert (inline, eager) == ([a], [b])


def test_eviction_takes_the_least_recently_used_idle_slot_and_says_so() -> None:
    evicted: list[int] = []
    sch = make(slots=2)
    sch.on_evict = lambda s: evicted.append(s.id)
    old, recent, new = Seq(0, [1, 2]), Seq(1, [3, 4]), Seq(2, [5, 6])
    for s in (old, recent):
        sch.submit(s, GREEDY, 1)
    sch.schedule(rows=8)
    for s in (old, recent):  # each samples a stop token: the turn ends, the slot stays held
        sch.record([s], torch.tensor([[0]]), torch.tensor([[-0.5]]), None)
    assert list(sch.idle) == [0, 1] and old.kv == 2  # ids [1, 2, 0]: the last sampled one not yet fed
    sch.submit(new, GREEDY, 1)
    sch.schedule(rows=8)
    assert evicted == [0] and (old.slot, new.slot) == (None, 0) and list(sch.idle) == [1]


def test_recording_ends_rows_at_a_stop_token_the_allowance_or_the_slot_end() -> None:
    sch = make(slots=3, capacity=8)
    stop, allowance, slot_end = Seq(0, [1]), Seq(1, [1]), Seq(2, [1, 2, 3, 4, 5])
    sch.submit(stop, GREEDY, 9)
    sch.submit(allowance, GREEDY, 2)
    sch.submit(slot_end, GREEDY, 9)
    sch.schedule(rows=8)
    # a block of three steps ([k, rows]): row 0 stops at step 2; row 1 reaches its 2 tokens; row 2 its
    # slot's end (capacity 8 - 1 = 7 positions: 5 ids + 2 sampled)
    tok = torch.tensor([[7, 7, 7], [0, 8, 8], [9, 9, 9]])
    lp = torch.full((3, 3), -1.0)
    done = sch.record([stop, allowance, slot_end], tok, lp, None)
    assert [s.id for s in done] == [0, 1, 2]
    assert (stop.out, stop.finish) == ([7, 0], "stop")
    assert (allowance.out, allowance.finish) == ([7, 8], "length")
    assert (slot_end.out, slot_end.finish) == ([7, 8], "length")
    sch.finish(done)
    assert not sch.busy() and list(sch.idle) == [0, 1, 2]


def test_a_block_stops_short_of_every_rows_allowance() -> None:
    sch = make(slots=2, capacity=64, block=8)
    a, b = Seq(0, [1, 2]), Seq(1, [3, 4])
    sch.submit(a, GREEDY, 10)
    sch.submit(b, GREEDY, 3)
    sch.schedule(rows=8)
    sch.record([a, b], torch.tensor([[5, 5]]), torch.tensor([[-1.0, -1.0]]), None)  # both go on
    assert sch.block_len(inline=False) == 2  # b has 2 tokens left
    assert sch.block_len(inline=True) == 1  # a newcomer decodes inline: one step


def test_chunked_prefill_takes_the_step_budget_and_requeues_the_rest() -> None:
    sch = make(slots=4, capacity=128)
    a, b, c = Seq(0, list(range(1, 11))), Seq(1, list(range(1, 31))), Seq(2, [4, 5])
    waiting = Seq(3, [6, 7])
    sch.queue = [waiting]
    assert sch.chunk([a, b, c]) == [(a, 10), (b, 30), (c, 2)]  # off (0): every prompt whole
    sch.prefill_chunk = 20
    # a whole (10), b cut at 10 of its 30, c left for a later step; both go back before what was queued
    assert sch.chunk([a, b, c]) == [(a, 10), (b, 10)]
    assert sch.queue == [b, c, waiting]
    b.kv = 10
    assert sch.chunk([b]) == [(b, 30)]  # its remaining 20 fit
    d = Seq(4, list(range(1, 41)))
    d.kv = 39  # all but the last token cached: the last one still runs
    assert sch.chunk([d]) == [(d, 40)]
