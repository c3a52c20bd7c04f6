"""How random is the window order? grain_rox's default block order against three others (issue 21).

Run as ``python benchmarks/bench_order.py [--quick] [--batch 32] [--seq-len 1024]
[--corpus 3e8 1e10 1e12] [--real-tokens 2e7] [--chunks K] [--seed 0]``. No timing: every
number is arithmetic on sample -> epoch-stream-offset maps (vectorised numpy). The tables go to
stdout (markdown), progress to stderr, every number to ``bench_out/order.json``.

**Orders**, all on one epoch stream: the corpus's chunks (64K tokens; smaller under 4M tokens)
in the order of the epoch's chunk permutation, the same for all four, so "chunk" below means a
position in that stream (within an epoch, one physical chunk). Epoch 0, one phase.

* ``blocks``: the package's default order (``_order._blocks``): the stream is cut into
  near-equal blocks of at most 2**29 tokens (512 Mi; the whole stream if smaller), served in
  stream order; inside a block all windows of the phase's ``seq_len`` (a grid from the block's
  start) come in a Feistel-permuted order. For the real corpus it is
  ``TokenPipeline(path, ...).plan.orders[0]`` over a ``.rox`` file written here with
  ``write_rox``; for the virtual corpora (too big to write) it is what
  ``grain_rox._pipeline._plan.source_orders`` builds (that function itself, called with
  stand-in corpora that have only shard sizes). Sample numbers come from an inverse written
  here; each one is then located by ``BlockOrder.locate`` and checked to land on its window.
* ``lanes``: grain_rox 0.1's order, still selectable (``order="lanes"``), built and checked the
  same way against ``LaneOrder.locate``.
* ``full``: one Feistel permutation (``FeistelPermutation``) of all the epoch's windows (windows
  of ``seq_len + 1`` tokens at stride ``seq_len`` over the whole stream), as Megatron/Levanter.
* ``streaming``: MosaicML-Streaming-like. The gist of its default (``py1e``, block 262,144
  samples): the stream's windows, in stream order, are cut into blocks of 262,144 windows;
  the blocks are served in a permuted order, each block's windows in a permuted order.
  (``py1e`` itself places each shard's samples at clipped random offsets of about a block
  around the shard's place and sorts, so its mixing window slides instead of having fixed
  edges; its pool is about the same size.)

**Sampling.** K chunks are drawn uniformly; for each order, the steps that serve *every*
window of those chunks are computed (an inverse map), so each statistic is exact for them.
``T`` is the epoch's steps, ``C`` the chunk tokens, ``step = sample // batch``.

**Metrics.**

* A chunk's windows: the served windows whose first token lies in it.
* Successor gap: for two text-consecutive windows of one document (the later starts
  ``seq_len`` tokens after the earlier, no document starts at the join), |step of the later
  - step of the earlier|. No real documents are involved: each chunk is cut into fake
  documents at pseudo-random places (each token starts one with probability 1/2,000, so the
  mean length is ~2,000 tokens) and at its edges (chunk-aligned documents). ``CV`` is the
  successor gaps' std / mean; ``in text order`` the share whose later text comes later.
* Revisit gap: the steps between two consecutive draws (in time) of one chunk.
* Live: a chunk is live from one of its draws to the next unless they are more than T/8
  apart (a chunk cut by a lane boundary, whose two parts are read at the epoch's start and
  end, is live twice, not all epoch). **pool** = C x the mean number of chunks live at a step
  = C x (sum over chunks of their live steps) / T (Little's law), estimated from the K chunks.
  It is the span of the corpus the next draws come from: lanes x C for ``lanes``, the block
  for the block orders, the corpus for ``full``.
* **reach@N**: the fraction of the epoch's chunks live during some step of N consecutive
  steps, averaged over the N steps' start (what N steps *can* draw from; ``pool`` is the
  N = 1 case). When N >= T: the fraction with any draw in the epoch, marked ``(>T)``.
* **period**: the draws of one chunk counted in aligned P-step blocks inside its live spans,
  pooled over chunks: Fano factor = variance / mean of the counts (about 1 for random draws,
  0 when every block holds the same count). ``period`` is the smallest P whose Fano factor is
  within 0.01 of the minimum over P <= min(512, median live span / 8), shown when that
  minimum is below 0.1. An autocorrelation peak does not show it: a lane's window sits at a
  uniform place inside each round, so the pooled autocorrelation of a chunk's draws is flat
  beyond one round (a deficit below it), not peaked at the round.

**Switches** (third table): the default order at a ``seq_len`` change in mid-block, measured
with the real ``BlockOrder`` on one block: the block's unserved windows become a stream of
holes that the new phase reads front to back, so nothing is replayed or skipped. The table
gives how many steps of the new phase read holes, the mean number of pieces (unrelated
stretches of text, split by joins) in one of those windows, and the tokens of the block not
served (the hole stream's last partial window and the grid's tail).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grain_rox import TokenPipeline, write_rox
from grain_rox._order._blocks import DEFAULT_BLOCK_TOKENS, BlockOrder
from grain_rox._order._chunks import Run
from grain_rox._order._lanes import LaneOrder
from grain_rox._order._permutation import FeistelPermutation, derive_key
from grain_rox._pipeline._plan import source_orders

REPO = Path(__file__).resolve().parent.parent
STREAMING_BLOCK = 262_144  # samples per block of MosaicML Streaming's default shuffle
BLOCK_TOKENS = DEFAULT_BLOCK_TOKENS  # the default order's block: 512 Mi tokens
DOC_MEAN = 2_000  # fake documents' mean length in tokens
SHARD_TOKENS = 1 << 32  # the virtual corpora's shard size
REACH = (100, 1_000, 10_000)
LIVE_PAUSE = 8  # a pause longer than T / 8 ends a chunk's live span
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"  .. [{time.perf_counter() - _T0:5.1f} s] {msg}", file=sys.stderr, flush=True)


def ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(which range, value) for the concatenated ranges ``[starts[i], starts[i] + counts[i])``.

    >>> [a.tolist() for a in ranges(np.array([5, 0]), np.array([2, 3]))]
    [[0, 0, 1, 1, 1], [5, 6, 0, 1, 2]]
    """
    counts = np.maximum(counts, 0)
    which = np.repeat(np.arange(counts.size), counts)
    first = np.cumsum(counts) - counts
    return which, starts[which] + np.arange(which.size) - first[which]


def grid_windows(
    chunks: np.ndarray, chunk: int, seg_start: np.ndarray, seg_windows: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows ``seg_start[g] + m * seq_len`` (``m < seg_windows[g]``; segments contiguous,
    ``seg_start[0] == 0``) whose first token lies in one of ``chunks``: (index into
    ``chunks``, g, m)."""
    lo = chunks * chunk
    g_lo = np.searchsorted(seg_start, lo, "right") - 1
    g_hi = np.searchsorted(seg_start, lo + chunk - 1, "right") - 1
    owner, g = ranges(g_lo, g_hi - g_lo + 1)
    rel = lo[owner] - seg_start[g]
    m_lo = -(-np.maximum(rel, 0) // seq_len)
    m_hi = np.minimum(seg_windows[g] - 1, (rel + chunk - 1) // seq_len)
    which, m = ranges(m_lo, m_hi - m_lo + 1)
    return owner[which], g[which], m


def grouped(keys: np.ndarray) -> list[np.ndarray]:
    """Indices of ``keys`` grouped by value (one sort, not one scan per value)."""
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    return np.split(order, cuts)


# ---- the orders: sample numbers of the windows of some chunks --------------------------------
@dataclasses.dataclass
class Order:
    name: str
    windows: int  # windows served in epoch 0
    chunk: int  # chunk tokens

    def draws(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index into ``chunks``, window start, sample number) of every served window."""
        raise NotImplementedError


class Lanes(Order):
    """grain_rox 0.1's order: the inverse of ``LaneOrder.locate`` for one phase, checked by it."""

    def __init__(self, order: LaneOrder, seq_len: int) -> None:
        if len(order.runs) != 1 or order.runs[0].start != 0 or order.max_seq_len != seq_len:
            raise ValueError("one phase from sample 0 with max_seq_len == seq_len, please")
        self.order, self.seq_len = order, seq_len
        self.rounds = (order.lane_tokens - seq_len - 1) // seq_len + 1  # rounds of epoch 0
        super().__init__("lanes", self.rounds * order.lanes, order.chunk_tokens)

    def draws(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        o = self.order
        starts = np.arange(o.lanes, dtype=np.int64) * o.lane_tokens
        owner, lane, j = grid_windows(
            chunks, o.chunk_tokens, starts, np.full(o.lanes, self.rounds), self.seq_len
        )
        offset = starts[lane] + j * self.seq_len
        sample = np.empty_like(j)
        for sel in grouped(j):  # round j serves lane l at slot phi_j^-1(l)
            r = int(j[sel[0]])
            sample[sel] = r * o.lanes + o.round_permutation(0, r).inverse(lane[sel])
        for part in np.array_split(np.arange(sample.size), max(1, sample.size // 2048)):
            rows = o.locate(sample[part])  # the package's own map, the ground truth
            if not ((rows.epoch == 0).all() and np.array_equal(rows.offset, offset[part])):
                raise AssertionError("the inverse disagrees with LaneOrder.locate")
        return owner, offset, sample


class Full(Order):
    """One Feistel permutation of all the epoch's windows."""

    def __init__(self, stream: int, chunk: int, seq_len: int, seed: int) -> None:
        super().__init__("full", (stream - 1) // seq_len, chunk)
        self.seq_len = seq_len
        self.perm = FeistelPermutation(self.windows, derive_key(seed, 0xF011))

    def draws(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        owner, _, k = grid_windows(
            chunks, self.chunk, np.zeros(1, np.int64), np.array([self.windows]), self.seq_len
        )
        return owner, k * self.seq_len, self.perm.inverse(k)


class Streaming(Order):
    """Streaming's gist: blocks of ``block`` windows in stream order, shuffled within, block
    order shuffled."""

    def __init__(self, stream: int, chunk: int, seq_len: int, seed: int, block: int) -> None:
        super().__init__("streaming", (stream - 1) // seq_len, chunk)
        self.seq_len, self.block, self.seed = seq_len, block, seed
        nb = -(-self.windows // block)
        self.sizes = np.minimum(block, self.windows - np.arange(nb) * block)
        served = FeistelPermutation(nb, derive_key(seed, 0xB10C))(np.arange(nb))  # q -> block
        first = np.cumsum(self.sizes[served]) - self.sizes[served]
        self.first_sample = np.empty(nb, np.int64)
        self.first_sample[served] = first

    def draws(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        owner, _, k = grid_windows(
            chunks, self.chunk, np.zeros(1, np.int64), np.array([self.windows]), self.seq_len
        )
        b = k // self.block
        sample = np.empty_like(k)
        for sel in grouped(b):
            i = int(b[sel[0]])
            perm = FeistelPermutation(int(self.sizes[i]), derive_key(self.seed, 0xB10C, i))
            sample[sel] = self.first_sample[i] + perm.inverse(k[sel] - i * self.block)
        return owner, k * self.seq_len, sample


class Blocks(Order):
    """The package's default order: the inverse of ``BlockOrder.locate`` for one phase,
    checked by it."""

    def __init__(self, order: BlockOrder, seq_len: int) -> None:
        if len(order.runs) != 1 or order.runs[0].start != 0:
            raise ValueError("one phase from sample 0, please")
        self.order, self.seq_len = order, seq_len
        blocks = np.arange(order.num_blocks)
        self.starts = order.block_start(blocks)
        self.counts = order.block_windows(blocks, seq_len)
        super().__init__("blocks", order.epoch_windows(seq_len), order.chunk_tokens)

    def draws(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        o, s = self.order, self.seq_len
        owner, b, m = grid_windows(chunks, self.chunk, self.starts, self.counts, s)
        sample = np.empty_like(m)
        for sel in grouped(b):
            i = int(b[sel[0]])
            perm = o.window_permutation(0, i, s)
            sample[sel] = o.windows_before(i, s) + perm.inverse(m[sel])
        offset = self.starts[b] + m * s
        for part in np.array_split(np.arange(sample.size), max(1, sample.size // 2048)):
            rows = o.locate(sample[part])  # the package's own map, the ground truth
            if not ((rows.epoch == 0).all() and np.array_equal(rows.offset, offset[part])):
                raise AssertionError("the inverse disagrees with BlockOrder.locate")
        return owner, offset, sample


# ---- the metrics ------------------------------------------------------------------------------
def doc_start(pos: np.ndarray, chunk: int) -> np.ndarray:
    """Whether a fake document starts at each stream position: at every chunk start, and
    elsewhere with probability 1 / DOC_MEAN (a keyed hash of the position)."""
    z = pos.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(31)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(29)
    return (pos % chunk == 0) | (z < np.uint64((1 << 64) // DOC_MEAN))


def spread(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return dict(mean=None, median=None, p10=None, p90=None, cv=None)
    mean = float(x.mean())
    return dict(
        mean=mean,
        median=float(np.median(x)),
        p10=float(np.percentile(x, 10)),
        p90=float(np.percentile(x, 90)),
        cv=float(x.std() / mean) if mean else None,
    )


def live_spans(owner: np.ndarray, step: np.ndarray, pause: float) -> tuple[np.ndarray, ...]:
    """Draws sorted by (chunk, step) and cut into live spans: (owner, step, span id of each
    draw, first step, last step and chunk of each span)."""
    order = np.lexsort((step, owner))
    owner, step = owner[order], step[order]
    new = np.ones(step.size, bool)
    new[1:] = (owner[1:] != owner[:-1]) | (np.diff(step) > pause)
    span = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:], step.size) - 1
    return owner, step, span, step[firsts], step[lasts], owner[firsts]


def reach(a: np.ndarray, b: np.ndarray, who: np.ndarray, n: int, steps: int, k: int) -> float:
    """Mean over the K chunks of the share of window starts s in [0, T - n] for which
    [s, s + n) meets one of the chunk's live spans [a, b] (sorted by chunk, then time)."""
    lo = np.maximum(a - n + 1, 0)
    hi = np.minimum(b, steps - n)
    prev = np.full(a.size, -1, np.int64)  # the previous span's end, same chunk
    same = np.zeros(a.size, bool)
    same[1:] = who[1:] == who[:-1]
    prev[1:] = np.where(same[1:], hi[:-1], -1)
    covered = np.maximum(0, hi - np.maximum(lo, prev + 1) + 1)
    return float(covered.sum()) / (steps - n + 1) / k


def fano_period(
    step: np.ndarray, span: np.ndarray, a: np.ndarray, b: np.ndarray
) -> tuple[int | None, float | None, int | None]:
    """(period or None, min Fano factor, its P) of the draws counted in aligned P-step blocks
    inside live spans of >= 2 draws (see the module doc)."""
    many = np.bincount(span, minlength=a.size) >= 2
    keep = many[span]
    step, span = step[keep], span[keep]
    length = (b - a + 1)[many]
    if length.size == 0 or np.median(length) < 16:
        return None, None, None
    fanos = {}
    for p in range(1, int(min(512, np.median(length) // 8)) + 1):
        blo, bhi = -(-a // p), (b + 1) // p - 1
        blocks = np.maximum(0, bhi - blo + 1)[many].sum()
        beta = step // p
        inside = (beta >= blo[span]) & (beta <= bhi[span])
        key_span, key_beta = span[inside], beta[inside]
        if blocks == 0 or key_span.size == 0:
            continue
        edge = np.flatnonzero((np.diff(key_span) != 0) | (np.diff(key_beta) != 0)) + 1
        runs = np.diff(np.concatenate([[0], edge, [key_span.size]]))
        mean = key_span.size / blocks
        fanos[p] = float((np.square(runs).sum() / blocks - mean**2) / mean)
    if not fanos:
        return None, None, None
    best = min(fanos.values())
    p_best = min(p for p, f in fanos.items() if f <= best + 0.01)
    return (p_best if best < 0.1 else None), best, p_best


def measure(order: Order, chunks: np.ndarray, num_chunks: int, batch: int, seq_len: int) -> dict:
    owner, offset, sample = order.draws(chunks)
    step = sample // batch
    steps = -(-order.windows // batch)
    k = chunks.size
    # successor gaps, documents: text order inside each chunk
    by_text = np.lexsort((offset, owner))
    o, off, st = owner[by_text], offset[by_text], step[by_text]
    pair = (o[1:] == o[:-1]) & (off[1:] == off[:-1] + seq_len) & ~doc_start(off[1:], order.chunk)
    signed = (st[1:] - st[:-1])[pair]
    succ = np.abs(signed)
    # revisit gaps and live spans: time order inside each chunk
    who, when, span, a, b, span_chunk = live_spans(owner, step, steps / LIVE_PAUSE)
    same = who[1:] == who[:-1]
    revisit = np.diff(when)[same]
    chunk_tokens = order.chunk
    pool = chunk_tokens * num_chunks * float((b - a + 1).sum()) / k / steps
    drawn = np.unique(owner).size / k
    reaches = {n: (reach(a, b, span_chunk, n, steps, k) if n < steps else drawn) for n in REACH}
    period, fano, fano_p = fano_period(when, span, a, b)
    return dict(
        order=order.name,
        steps_per_epoch=steps,
        windows_per_epoch=order.windows,
        sampled_chunks=k,
        pool_tokens=pool,
        successor=spread(succ),
        successor_pairs=int(succ.size),
        in_text_order=float((signed > 0).mean()) if signed.size else None,
        within_64=float((succ <= 64).mean()) if succ.size else None,
        revisit=spread(revisit),
        period=period,
        min_fano=fano,
        min_fano_p=fano_p,
        reach={str(n): v for n, v in reaches.items()},
        reach_past_epoch=[n for n in REACH if n >= steps],
    )


def switches(seq_len: int, batch: int, seed: int) -> list[dict[str, Any]]:
    """The default order on one full block switched to another seq_len after a share of it."""
    block = BLOCK_TOKENS
    out = []
    for done in (0.25, 0.5, 0.75):
        for new in (seq_len // 2, 2 * seq_len, 4 * seq_len):
            served = int(done * ((block - 1) // seq_len))
            runs = [Run(0, served, seq_len), Run(served, 1 << 62, new)]
            order = BlockOrder([block], seed=seed, chunk_tokens=1 << 16, runs=runs,
                               max_seq_len=max(seq_len, new))  # fmt: skip
            segment = order._segments[1]  # the hole stream (a private view, read here only)
            hole_windows = segment.stop - segment.start
            probe = segment.start + np.linspace(0, hole_windows - 1, 2048).astype(np.int64)
            pieces = np.bincount(order.locate(probe).span_arrays()[0]).mean()
            used = served * seq_len + hole_windows * new
            out.append(
                dict(
                    served=done,
                    new_seq_len=new,
                    hole_steps=hole_windows / batch,
                    pieces_per_window=float(pieces),
                    unserved_tokens=int(block - used),
                )
            )
    return out


# ---- corpora ----------------------------------------------------------------------------------
def stand_in(shard_tokens: Sequence[int], path: str) -> Any:
    """What ``source_orders`` reads of a corpus: its shards' sizes, their total, a path."""
    shards = [types.SimpleNamespace(num_tokens=int(t)) for t in shard_tokens]
    return types.SimpleNamespace(num_tokens=int(sum(shard_tokens)), shards=shards, paths=[path])


def virtual_shards(tokens: int) -> list[int]:
    """A virtual corpus's shard sizes: SHARD_TOKENS each, and the rest."""
    full, rest = divmod(tokens, SHARD_TOKENS)
    return [SHARD_TOKENS] * full + ([rest] if rest else [])


def real_orders(
    tokens: int, batch: int, seq_len: int, seed: int, tmp: str
) -> tuple[tuple[BlockOrder, LaneOrder], TokenPipeline]:
    """The orders of TokenPipelines over a .rox file of ``tokens`` random tokens: the default
    and ``order="lanes"``."""
    path = os.path.join(tmp, "order.rox")
    data = np.random.default_rng(seed).integers(1, 50_000, size=tokens, dtype=np.uint16)
    write_rox([data], path, separator=0)
    pipe = TokenPipeline(path, seq_len=seq_len, global_batch_size=batch, seed=seed)
    lanes_pipe = dataclasses.replace(pipe, order="lanes")
    orders = (pipe.plan.orders[0], lanes_pipe.plan.orders[0])
    for step in (0, 1, 12_345):  # one source, one phase: step k holds samples [kB, kB + B)
        own = pipe.schedule.step_samples(step, 0, batch)[2]
        assert np.array_equal(own, step * batch + np.arange(batch))
    # the virtual corpora's path (source_orders on a stand-in) gives these very orders
    corpus = pipe.plan.corpora[pipe.names[0]]
    stand = {pipe.names[0]: stand_in([sh.num_tokens for sh in corpus.shards], corpus.paths[0])}
    probe = np.random.default_rng(1).integers(0, orders[0].windows_per_epoch * 3, 4096)
    for p, order in zip((pipe, lanes_pipe), orders, strict=True):
        twin = source_orders(p, stand)[0]
        assert (twin.name, twin.seed, twin.num_chunks) == (order.name, order.seed, order.num_chunks)
        assert np.array_equal(twin.locate(probe).offset, order.locate(probe).offset)
    return orders, pipe  # type: ignore[return-value]


# ---- report -----------------------------------------------------------------------------------
def human(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.3g}%" if x >= 1e-4 else f"{100 * x:.2g}%"


def fixed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def tables(rows: list[dict]) -> str:
    head = (
        "| order | corpus | pool | succ. gap mean | median | p10 | p90 | CV | period "
        "| reach@100 | @1k | @10k |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r["successor"]
        reach_cells = [
            pct(r["reach"][str(n)]) + (" (>T)" if n in r["reach_past_epoch"] else "") for n in REACH
        ]
        period = f"{r['period']} steps" if r["period"] else "none"
        out.append(
            f"| {r['order']} | {r['corpus']} | {human(r['pool_tokens'])} "
            f"({pct(r['pool_tokens'] / r['corpus_tokens'])}) | {human(s['mean'])} | "
            f"{human(s['median'])} | {human(s['p10'])} | {human(s['p90'])} | "
            f"{fixed(s['cv'])} | {period} | " + " | ".join(reach_cells) + " |"
        )
    out += [
        "",
        "| order | corpus | lanes/blocks | steps/epoch | revisit gap mean | median | p90 "
        "| revisit CV | in text order | succ. <= 64 steps | min Fano (P) | pairs |",
        "|" + "---|" * 12,
    ]
    for r in rows:
        v = r["revisit"]
        fano = "-" if r["min_fano"] is None else f"{r['min_fano']:.2f} ({r['min_fano_p']})"
        out.append(
            f"| {r['order']} | {r['corpus']} | {r['units']} | {human(r['steps_per_epoch'])} | "
            f"{human(v['mean'])} | {human(v['median'])} | {human(v['p90'])} | "
            f"{fixed(v['cv'])} | {pct(r['in_text_order'])} | {pct(r['within_64'])} | {fano} | "
            f"{r['successor_pairs']} |"
        )
    out.append(
        "\npool, reach, period: see the module doc (docs/order.md). (>T): N is at least the "
        "epoch's steps; the share of chunks drawn in the epoch is shown."
    )
    return "\n".join(out)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer sampled chunks (< 3 min)")
    p.add_argument("--batch", type=int, default=32, help="global batch size (default 32)")
    p.add_argument("--seq-len", type=int, default=1024, help="seq_len (default 1024)")
    p.add_argument(
        "--corpus",
        type=float,
        nargs="*",
        default=[3e8, 1e10, 1e12],
        help="virtual corpus sizes in tokens (default 3e8 1e10 1e12)",
    )
    p.add_argument(
        "--real-tokens",
        type=float,
        default=2e7,
        help="tokens of the real .rox corpus written first (default 2e7)",
    )
    p.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="chunks sampled per corpus (default 4096, --quick 512)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "bench_out" / "order.json"))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    k = args.chunks or (512 if args.quick else 4096)
    batch, seq_len, seed = args.batch, args.seq_len, args.seed
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        real, pipe = real_orders(int(args.real_tokens), batch, seq_len, seed, tmp)
        log(
            f"real corpus: {real[0].num_chunks} chunks, {real[0].num_blocks} block(s), "
            f"{real[1].lanes} lanes; checked against source_orders on a stand-in"
        )
        corpora = [(f"{human(args.real_tokens)} (.rox)", real)]
        lanes_pipe = dataclasses.replace(pipe, order="lanes")
        for tokens in args.corpus:
            stand = {pipe.names[0]: stand_in(virtual_shards(int(tokens)), f"<{tokens:.0e}>")}
            pair = (source_orders(pipe, stand)[0], source_orders(lanes_pipe, stand)[0])
            corpora.append((f"{tokens:.0e}".replace("+", ""), pair))
    rng = np.random.default_rng(seed)
    for label, (blocks, lanes) in corpora:
        stream, chunk = lanes.stream_tokens, lanes.chunk_tokens
        n = min(k, lanes.num_chunks)
        chunks = np.sort(rng.choice(lanes.num_chunks, size=n, replace=False)).astype(np.int64)
        orders: list[tuple[Order, str]] = [
            (
                Blocks(blocks, seq_len),
                f"{blocks.num_blocks} x {human(min(BLOCK_TOKENS, stream))} tok",
            ),
            (Lanes(lanes, seq_len), f"{lanes.lanes} lanes"),
            (Full(stream, chunk, seq_len, seed), "1"),
            (Streaming(stream, chunk, seq_len, seed, STREAMING_BLOCK), ""),
        ]
        for order, units in orders:
            t0 = time.perf_counter()
            row = measure(order, chunks, lanes.num_chunks, batch, seq_len)
            if isinstance(order, Streaming):
                units = f"{order.sizes.size} x {human(STREAMING_BLOCK * seq_len)} tok"
            row.update(
                corpus=label, corpus_tokens=stream, units=units, seconds=time.perf_counter() - t0
            )
            rows.append(row)
            log(
                f"{label:>14} {order.name:<12} {n} chunks, {row['successor_pairs']} pairs, "
                f"{row['seconds']:.1f} s"
            )
    gaps = switches(seq_len, batch, seed)
    print(
        f"# Window order at ({batch}, {seq_len}), seed {seed}, {k} chunks sampled per corpus "
        f"({'quick' if args.quick else 'full'} mode)\n"
    )
    print(tables(rows))
    print(
        f"\nSwitches: the default order on one {human(BLOCK_TOKENS)}-token block, seq_len "
        f"{seq_len} switched to another after a share of the block's windows\n"
    )
    print("| served | new seq_len | steps reading holes | pieces per window | unserved tokens |")
    print("|---|---|---|---|---|")
    for h in gaps:
        print(
            f"| {pct(h['served'])} | {h['new_seq_len']} | {human(h['hole_steps'])} | "
            f"{h['pieces_per_window']:.2f} | {h['unserved_tokens']} |"
        )
    elapsed = time.perf_counter() - _T0
    print(f"\n({elapsed:.0f} s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = dict(
        batch=batch,
        seq_len=seq_len,
        seed=seed,
        chunks=k,
        quick=args.quick,
        streaming_block=STREAMING_BLOCK,
        block_tokens=BLOCK_TOKENS,
        doc_mean=DOC_MEAN,
    )
    out.write_text(
        json.dumps(dict(config=config, rows=rows, switches=gaps, seconds=elapsed), indent=1)
    )


if __name__ == "__main__":
    main()
