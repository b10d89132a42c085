"""Which cached sequence a new prompt continues: an index of idle sequences by block hashes of their ids.

A prompt of the ``TokenPolicy.generate`` API comes as plain ids; the engine finds the idle sequence that
shares the longest prefix with it (the same episode's previous turn, or the tree node a branch forks
from) and continues from that cache. Ids are hashed in blocks of ``BLOCK`` tokens, each hash chained on
the previous one, so a lookup costs one pass over the prompt's blocks; the match is then checked and
extended token by token.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolgym.agents.engine.engine import Seq

BLOCK = 16


def block_hashes(ids: Sequence[int], limit: int) -> list[int]:
    """Chained hashes of the first ``k·BLOCK`` ids for k = 1 … limit // BLOCK.

    >>> len(block_hashes(list(range(40)), 40)), block_hashes([1] * 16, 16) == block_hashes([1] * 17, 17)
    (2, True)
    """
    out: list[int] = []
    h = 0
    for k in range(limit // BLOCK):
        h = hash((h, tuple(ids[k * BLOCK : (k + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixIndex:
    def __init__(self) -> None:
        self._by_key: dict[tuple[int, int], dict[int, Seq]] = {}
        self._keys: dict[int, list[tuple[int, int]]] = {}

    def add(self, seq: Seq) -> None:
        self.remove(seq)
        if seq.slot is None or seq.kv < BLOCK:
            return
        keys = [(k + 1, h) for k, h in enumerate(block_hashes(seq.ids, seq.kv))]
        for key in keys:
            self._by_key.setdefault(key, {})[seq.id] = seq
        self._keys[seq.id] = keys

    def remove(self, seq: Seq) -> None:
        for key in self._keys.pop(seq.id, []):
            bucket = self._by_key.get(key)
            if bucket is not None:
                bucket.pop(seq.id, None)
                if not bucket:
                    del self._by_key[key]

    def clear(self) -> None:
        self._by_key.clear()
        self._keys.clear()

    def match(self, ids: Sequence[int]) -> tuple[Seq | None, int]:
        """(the indexed sequence sharing the longest cached prefix with ``ids``, that length), leaving at
        least the last id of ``ids`` to run; (None, 0) when none shares a whole block."""
        limit = len(ids) - 1
        hashes = block_hashes(ids, limit)
        for k in range(len(hashes), 0, -1):
            bucket = self._by_key.get((k, hashes[k - 1]))
            if not bucket:
                continue
            best: tuple[Seq | None, int] = (None, 0)
            for seq in bucket.values():
                n = k * BLOCK
                if seq.ids[:n] != list(ids[:n]):
                    continue  # a hash collision
                top = min(seq.kv, limit)
                while n < top and seq.ids[n] == ids[n]:
                    n += 1
                if n > best[1]:
                    best = (seq, n)
            if best[0] is not None:
                return best
        return None, 0
