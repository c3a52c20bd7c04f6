"""Where every token of a Beam conversion lands: the arithmetic, with no Beam in it.

A conversion's documents are ordered by their key ``(part, index)``: by part (an input file's
number), then by index (the document's position in it). Once each part's total is known, a
document's first token has one global offset (the parts before it, then the documents before
it in its part), and from there the layout is the local converter's: documents each followed
by the EOS token, concatenated, cut into blocks of ``tokens_per_block`` tokens, the last block
padded, ``blocks_per_shard`` blocks to a shard (roxxel's rotation rule). So the shards a Beam
pipeline writes are the bytes :func:`~grain_rox.write_rox` writes for the same documents in the
same order, whatever the bundling, retries or number of workers.

>>> plan = ShardPlan.from_parts([(0, 7, 2), (1, 3, 1)], tokens_per_block=4, blocks_per_shard=1)
>>> plan.num_tokens, plan.num_shards, plan.num_padding_tokens, plan.part_start
(10, 3, 2, {0: 0, 1: 7})
>>> [(p.shard, p.start, p.stop, p.offset) for p in plan.pieces(6, 3)]
[(1, 2, 4, 0), (2, 0, 1, 2)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple


class Piece(NamedTuple):
    """A run of one document's tokens inside one shard: the shard's tokens ``[start, stop)``
    are the document's tokens ``[offset, offset + stop - start)``."""

    shard: int
    start: int
    stop: int
    offset: int


def check_key(key: Any) -> tuple[Any, int]:
    """A document's order key: ``(part, index)``, part an int or str, index an int >= 0.

    >>> check_key((3, 0))
    (3, 0)
    >>> check_key("doc-1")
    Traceback (most recent call last):
    ValueError: a document's key must be (part, index) with part an int or str and index an int >= 0 (e.g. (input file number, position in it)); got 'doc-1'
    """
    ok = (
        isinstance(key, tuple)
        and len(key) == 2
        and isinstance(key[0], (int, str))
        and not isinstance(key[0], bool)
        and isinstance(key[1], int)
        and not isinstance(key[1], bool)
        and key[1] >= 0
    )
    if not ok:
        raise ValueError(
            "a document's key must be (part, index) with part an int or str and index an int "
            f">= 0 (e.g. (input file number, position in it)); got {key!r}"
        )
    return key


def part_offsets(part: Any, entries: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sort one part's ``(index, tokens)`` entries; return their indices and the offset of each
    document's first token within the part. Two documents with one key are an error.

    >>> part_offsets(0, [(5, 3), (1, 2)])
    ([1, 5], [0, 2])
    """
    ordered = sorted(entries)
    indices = [i for i, _ in ordered]
    offsets = []
    total = 0
    for k, (index, n) in enumerate(ordered):
        if k and indices[k - 1] == index:
            raise ValueError(
                f"two documents have the key ({part!r}, {index}): keys must be unique, or the "
                "order of the documents (and so the shards) would depend on the runner"
            )
        offsets.append(total)
        total += n
    return indices, offsets


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The whole conversion's layout, from each part's totals.

    Attributes:
      tokens_per_block: tokens in one block.
      blocks_per_shard: blocks in a full shard (``None``: one file holds everything).
      part_start: the global offset of each part's first token.
      num_tokens: tokens of all documents and their EOS tokens (no padding).
      num_documents: documents in all.
    """

    tokens_per_block: int
    blocks_per_shard: int | None
    part_start: dict[Any, int]
    num_tokens: int
    num_documents: int

    @classmethod
    def from_parts(
        cls,
        totals: Sequence[tuple[Any, int, int]],
        *,
        tokens_per_block: int,
        blocks_per_shard: int | None,
    ) -> ShardPlan:
        """The plan from ``(part, tokens, documents)`` of every part, in any order."""
        kinds = {type(p) for p, _, _ in totals}
        if len(kinds) > 1:
            raise ValueError(
                f"the documents' parts mix types {sorted(k.__name__ for k in kinds)}: they "
                "cannot be ordered; key every document's part with one type (int or str)"
            )
        start: dict[Any, int] = {}
        tokens = documents = 0
        for part, n, docs in sorted(totals, key=lambda t: t[0]):
            start[part] = tokens
            tokens += n
            documents += docs
        return cls(tokens_per_block, blocks_per_shard, start, tokens, documents)

    @property
    def shard_tokens(self) -> int | None:
        """Tokens in a full shard (``None``: one file)."""
        if self.blocks_per_shard is None:
            return None
        return self.blocks_per_shard * self.tokens_per_block

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.tokens_per_block)

    @property
    def num_padding_tokens(self) -> int:
        """Tokens that pad the last block."""
        return self.num_blocks * self.tokens_per_block - self.num_tokens

    @property
    def num_shards(self) -> int:
        if self.num_tokens == 0:
            return 0
        if self.blocks_per_shard is None:
            return 1
        return -(-self.num_blocks // self.blocks_per_shard)

    def shard_length(self, shard: int) -> int:
        """The tokens of documents (padding not counted) in ``shard``."""
        cap = self.shard_tokens
        if cap is None:
            return self.num_tokens
        return min(cap, self.num_tokens - shard * cap)

    def shard_of(self, offset: int) -> int:
        """The shard that holds global token ``offset``."""
        cap = self.shard_tokens
        return 0 if cap is None else min(offset // cap, self.num_shards - 1)

    def pieces(self, start: int, length: int) -> Iterator[Piece]:
        """Cut a document at global tokens ``[start, start + length)`` at shard boundaries."""
        cap = self.shard_tokens
        done = 0
        while done < length:
            at = start + done
            shard = self.shard_of(at)
            base = 0 if cap is None else shard * cap
            take = length - done if cap is None else min(length - done, base + cap - at)
            yield Piece(shard, at - base, at - base + take, done)
            done += take
