"""Draw the documentation's figures from the package itself, into ``docs/figures/*.svg``.

    python docs/figures.py            # rewrite docs/figures/
    python docs/figures.py OUT_DIR    # write them elsewhere (tests/test_docs_site.py compares)

Each figure is computed from real grain_rox objects on small data written here: the window
order from a ``TokenPipeline``'s own source order (``pipe.plan.orders``), the mixture from its
schedule, the packing efficiency from ``pack_documents`` over the embedded prose corpus. The
output is deterministic (a fixed SVG hash salt, no date, fixed seeds), so the committed files
can be checked for staleness byte for byte with the same matplotlib version.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import sys
import tempfile
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import grain_rox
from grain_rox import Phase, TokenPipeline, cli

FIGURES_DIR = pathlib.Path(__file__).parent / "figures"
PHASE_COLORS = ("#4c72b0", "#dd8452", "#55a868")
SOURCE_COLORS = {"code": "#4c72b0", "prose": "#dd8452"}
STYLE = {
    "svg.hashsalt": "grain_rox-docs",
    "svg.fonttype": "path",
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
}


# ---- the window order -----------------------------------------------------------------------
# A toy source at a scale one can draw: 3 shards (160, 128 and 120 tokens), chunks of 32 tokens
# (64K in a real run), blocks of 128 tokens (512 Mi), a phase of 5 steps x 2 rows at seq_len 16
# that stops in mid-block, then seq_len 24.
ORDER_SHARDS = (160, 128, 120)
ORDER_CHUNK, ORDER_BLOCK, ORDER_BATCH = 32, 128, 2
ORDER_PHASES = (
    Phase(steps=5, batch_size=2, seq_len=16),
    Phase(steps=None, batch_size=2, seq_len=24),
)


def _box(ax, x, w, y, h, color, label="", hatch=None, text_color="white", **kw) -> None:
    ax.add_patch(
        Rectangle((x, y), w, h, facecolor=color, edgecolor="white", lw=1.0, hatch=hatch, **kw)
    )
    if label:
        ax.text(
            x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=7.5, color=text_color
        )


def _strip(ax, title: str, xmax: float) -> None:
    ax.set_title(title)
    ax.set_xlim(-2, xmax + 2)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def order_figure(workdir: pathlib.Path) -> Figure:
    """chunks -> epoch stream -> blocks -> each block's permuted window grid -> the holes a
    seq_len change in mid-block leaves, read by the next phase."""
    paths = []
    for i, n in enumerate(ORDER_SHARDS):
        path = workdir / f"order_{'abc'[i]}.rox"
        tokens = np.arange(1, n + 1, dtype=np.uint16)
        grain_rox.write_rox([tokens], path, block_size=16)  # 8-token blocks: no padding
        paths.append(str(path))
    pipe = TokenPipeline(
        paths, phases=list(ORDER_PHASES), chunk_tokens=ORDER_CHUNK, block_tokens=ORDER_BLOCK
    )
    order = pipe.plan.orders[0]
    chunk_color = plt.get_cmap("tab20")
    stream = order.stream_tokens
    fig, axes = plt.subplots(5, 1, figsize=(9, 7.6), height_ratios=[1, 1, 0.8, 1.4, 1.3])
    fig.subplots_adjust(left=0.03, right=0.98, top=0.97, bottom=0.05, hspace=0.95)

    # 1. Shards cut into chunks; a shard's tail shorter than a chunk is not used.
    ax = axes[0]
    total = sum(ORDER_SHARDS) + 8 * (len(ORDER_SHARDS) - 1)
    _strip(ax, "1. Each shard is cut into chunks (64K tokens in a real run; 32 here)", total)
    x, chunk = 0, 0
    for i, n in enumerate(ORDER_SHARDS):
        for _ in range(n // ORDER_CHUNK):
            _box(ax, x, ORDER_CHUNK, 0.15, 0.6, chunk_color(chunk), str(chunk))
            x, chunk = x + ORDER_CHUNK, chunk + 1
        if n % ORDER_CHUNK:
            tail = n % ORDER_CHUNK
            _box(ax, x, tail, 0.15, 0.6, "#dddddd", "tail", text_color="#555555")
            x += tail
        ax.text(x - n / 2, 0.9, f"shard {i} ({n} tokens)", ha="center", fontsize=7.5)
        x += 8
    ax.set_xticks([])
    ax.spines["bottom"].set_visible(False)

    # 2. The epoch stream: the chunks in epoch 0's seeded order.
    ax = axes[1]
    _strip(
        ax,
        "2. Epoch 0's stream: the chunks in a seeded Feistel order (a new one every epoch)",
        stream,
    )
    for k, c in enumerate(order.physical_chunks(0, np.arange(order.num_chunks)).tolist()):
        _box(ax, k * ORDER_CHUNK, ORDER_CHUNK, 0.15, 0.7, chunk_color(c), str(c))
    ax.set_xticks(range(0, stream + 1, 64))
    ax.tick_params(labelsize=7)

    # 3. Blocks of at least block_tokens.
    ax = axes[2]
    _strip(
        ax,
        f"3. ... cut into {order.num_blocks} blocks of at least block_tokens (512 Mi in a real run; 128 here)",
        stream,
    )
    for b in range(order.num_blocks):
        lo = int(order.block_start(b))
        hi = int(order.block_start(b + 1)) if b + 1 < order.num_blocks else stream
        _box(ax, lo, hi - lo, 0.2, 0.6, "#8c8c8c", f"block {b}")
    ax.set_xticks([])
    ax.spines["bottom"].set_visible(False)

    # 4. Every window the two phases serve, where it reads, and at which step.
    ax = axes[3]
    _strip(
        ax,
        "4. Each block's windows (seq_len + 1 tokens, stride seq_len) served in a seeded permutation: the step of each",
        stream,
    )
    samples = np.arange(17)  # epoch 0: 10 windows at 16, 2 over holes, 5 in block 2 at 24
    rows = order.locate(samples)
    assert set(rows.epoch.tolist()) == {0}
    row, _, length, _ = rows.span_arrays()
    phase_of = np.where(samples < 10, 0, 1)
    step_of = np.where(samples < 10, samples // ORDER_BATCH, 5 + (samples - 10) // ORDER_BATCH)
    first_phase = ORDER_PHASES[0].seq_len
    holes = [
        int(order.block_start(1)) + w * first_phase
        for w in order.window_permutation(0, 1, first_phase)(np.arange(3, 7)).tolist()
    ]
    for w in holes:  # block 1's grid windows the first phase did not serve
        ax.add_patch(
            Rectangle(
                (w, 0.55),
                first_phase,
                0.35,
                fill=False,
                hatch="////",
                edgecolor=PHASE_COLORS[1],
                lw=0.8,
            )
        )
    grid_rows = [r for r in range(samples.size) if (row == r).sum() == 1]
    for r in grid_rows:
        s = int(rows.seq_len[r])
        _box(
            ax,
            int(rows.offset[r]),
            s,
            0.55 if phase_of[r] == 0 else 0.1,
            0.35,
            PHASE_COLORS[phase_of[r]],
            str(step_of[r]),
        )
    ax.text(
        0,
        -0.36,
        "top: phase 0 (seq_len 16), steps 0-4",
        ha="left",
        va="bottom",
        fontsize=7.5,
        color=PHASE_COLORS[0],
    )
    ax.text(
        int(order.block_start(1)) + 64,
        -0.36,
        "hatched: unserved at the change",
        ha="center",
        va="bottom",
        fontsize=7.5,
        color=PHASE_COLORS[1],
    )
    ax.text(
        stream,
        -0.36,
        "bottom: phase 1 (seq_len 24), steps 6-8",
        ha="right",
        va="bottom",
        fontsize=7.5,
        color=PHASE_COLORS[1],
    )
    ax.set_xticks(range(0, stream + 1, 64), [])

    # 5. Block 1's holes strung together, read by the new phase front to back.
    ax = axes[4]
    hole_rows = [r for r in range(samples.size) if (row == r).sum() > 1]
    hole = first_phase + 1  # a hole is a whole window: all its tokens, all its pairs
    width = len(holes) * hole
    _strip(
        ax,
        "5. Block 1's unserved windows, whole and in permuted order, become a stream of holes the next phase reads like a cursor",
        width,
    )
    for k, w in enumerate(holes):
        _box(
            ax,
            k * hole,
            hole,
            0.1,
            0.35,
            "#bbbbbb",
            f"stream {w}-{w + hole}",
            text_color="black",
        )
    for k in range(1, len(holes)):
        ax.axvline(k * hole, ymin=0.05, ymax=0.95, color="#c44e52", lw=1.2, ls="--")
    cursor = 0
    for r in hole_rows:
        s = int(rows.seq_len[r])
        pieces = length[row == r]
        assert pieces.sum() == s + 1, (r, pieces)
        _box(ax, cursor, s, 0.55, 0.35, PHASE_COLORS[1], f"step {step_of[r]}: {len(pieces)} pieces")
        cursor += s
    ax.text(
        width,
        -0.32,
        "dashed: joins (a new segment; no loss on the target across one)",
        ha="right",
        va="bottom",
        fontsize=7.5,
        color="#c44e52",
    )
    ax.set_xticks(range(0, width + 1, 16))
    ax.tick_params(labelsize=7)
    return fig


# ---- a mixture over curriculum phases ------------------------------------------------------
MIX_PHASES = (
    Phase(steps=40, batch_size=16, seq_len=64, weights={"code": 0.7, "prose": 0.3}),
    Phase(steps=40, batch_size=8, seq_len=128, weights={"code": 0.3, "prose": 0.7}),
    Phase(steps=None, batch_size=16, seq_len=64, weights={"code": 0.45, "prose": 0.55}),
)
MIX_STEPS = 120


def mixture_figure(workdir: pathlib.Path) -> Figure:
    """Rows per source in every step, and the share served so far in each phase, from a
    three-phase pipeline's schedule."""
    rng = np.random.default_rng(0)
    sources = {}
    for name in ("code", "prose"):
        sources[name] = str(workdir / f"mix_{name}.rox")
        grain_rox.write_rox(
            [rng.integers(1, 50_000, 20_000, dtype=np.uint16)], sources[name], separator=0
        )
    pipe = TokenPipeline(sources, phases=list(MIX_PHASES), seed=0)
    names = pipe.names
    rows = np.zeros((MIX_STEPS, len(names)))
    tokens = np.zeros((MIX_STEPS, len(names)))
    for step in range(MIX_STEPS):
        phase, source, _ = pipe.schedule.step_samples(
            step, 0, MIX_PHASES[pipe.schedule.phase_of_step(step)].batch_size
        )
        counts = np.bincount(source, minlength=len(names))
        rows[step] = counts
        tokens[step] = counts * MIX_PHASES[phase].seq_len
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, height_ratios=[1.3, 1])
    fig.subplots_adjust(left=0.08, right=0.98, top=0.93, bottom=0.1, hspace=0.3)
    steps = np.arange(MIX_STEPS)
    base = np.zeros(MIX_STEPS)
    for i, name in enumerate(names):
        top.bar(
            steps,
            rows[:, i],
            bottom=base,
            width=1.0,
            color=SOURCE_COLORS[name],
            label=name,
            edgecolor="white",
            lw=0.3,
        )
        base += rows[:, i]
    top.set_ylabel("rows in the batch")
    top.set_title(
        "Rows of each source in every global batch (batch size and weights change with the phase)"
    )
    top.legend(loc="upper right", ncols=2, fontsize=8, frameon=False)
    bounds = pipe.schedule.step_starts[1:-1]
    for ax in (top, bottom):
        for b in bounds:
            ax.axvline(b - 0.5, color="black", lw=0.8, ls=":")
    for p, (lo, phase) in enumerate(zip([0, *bounds], MIX_PHASES, strict=True)):
        top.text(lo + 1, 17.2, f"phase {p}: {phase.batch_size} x {phase.seq_len}", fontsize=7.5)
    top.set_ylim(0, 19.5)
    # Exact mixing: inside each phase, code's rows so far minus weight x rows so far.
    starts = [0, *bounds, MIX_STEPS]
    for p in range(len(MIX_PHASES)):
        lo, hi = starts[p], starts[p + 1]
        served = np.cumsum(rows[lo:hi], axis=0)
        weight = MIX_PHASES[p].weights["code"]  # type: ignore[index]
        gap = served[:, 0] - weight * served.sum(axis=1)
        assert np.abs(gap).max() <= 1, gap
        bottom.plot(steps[lo:hi], gap, color=SOURCE_COLORS["code"], lw=1.2, marker=".", ms=3)
        bottom.text(lo + 1, 1.15, f"weight {weight}", fontsize=7.5)
    bottom.axhspan(-1, 1, color="#eeeeee", zorder=0)
    bottom.set_ylabel("code rows - w * rows")
    bottom.set_xlabel("global step")
    bottom.set_ylim(-1.6, 1.6)
    bottom.set_xlim(-1, MIX_STEPS)
    bottom.set_title(
        "Code rows served so far in the phase, minus its weight x rows so far: within +-1 at every step"
    )
    return fig


# ---- packing efficiency -----------------------------------------------------------------
PACK_DOCUMENTS = 100
PACK_SEQ_LENS = (256, 512, 1024, 2048)
PACK_BATCH = 16


def packing_figure(workdir: pathlib.Path) -> Figure:
    """The embedded prose corpus (byte tokens): its document lengths, and the share of real
    tokens in the rows of pack_documents' best- and first-fit, against one document per row."""
    path = workdir / "prose.rox"
    argv = ["convert", "--builtin", "prose", "-o", str(path), "--limit", str(PACK_DOCUMENTS)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = cli.main([*argv, "--no-progress"])  # the grain-rox command, in this process
    assert status == 0, argv
    whole = grain_rox.RoxDocumentSource(path, seq_len=1 << 30)  # one record per document
    lengths = np.array([whole[i]["inputs"].size + 1 for i in range(len(whole))])  # + its EOS
    efficiency: dict[str, list[float]] = {
        "best_fit": [],
        "first_fit": [],
        "one document per row": [],
    }
    for seq_len in PACK_SEQ_LENS:
        docs = grain_rox.RoxDocumentSource(path, seq_len=seq_len)
        for method in ("best_fit", "first_fit"):
            packed = grain_rox.pack_documents(
                docs, seq_len=seq_len, batch_size=PACK_BATCH, num_epochs=1, method=method
            )
            efficiency[method].append(grain_rox.padding_efficiency(list(packed)))
        pairs = lengths - 1  # next-token pairs per document, split into rows of seq_len
        efficiency["one document per row"].append(
            float(pairs.sum() / (np.ceil(pairs / seq_len).sum() * seq_len))
        )
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), width_ratios=[1, 1.2])
    fig.subplots_adjust(left=0.07, right=0.98, top=0.87, bottom=0.15, wspace=0.25)
    left.hist(
        lengths,
        bins=np.logspace(np.log10(lengths.min()), np.log10(lengths.max() + 1), 30),
        color="#8c8c8c",
    )
    left.set_xscale("log")
    left.set_xlabel("document length (byte tokens, EOS included)")
    left.set_ylabel("documents")
    left.set_title(f"{len(lengths)} documents of the embedded prose corpus")
    markers = {
        "best_fit": ("o", "#4c72b0"),
        "first_fit": ("s", "#dd8452"),
        "one document per row": ("^", "#8c8c8c"),
    }
    for label, values in efficiency.items():
        marker, color = markers[label]
        right.plot(PACK_SEQ_LENS, values, marker=marker, color=color, label=label, lw=1.4, ms=4)
        for x, y in zip(PACK_SEQ_LENS, values, strict=True):
            if label == "best_fit":
                right.annotate(
                    f"{y:.3f}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                )
    right.set_xscale("log", base=2)
    right.set_xticks(PACK_SEQ_LENS, [str(s) for s in PACK_SEQ_LENS])
    right.set_xlabel("seq_len")
    right.set_ylabel("real tokens / row positions")
    right.set_ylim(0, 1.05)
    right.set_title(f"padding_efficiency of pack_documents, {PACK_BATCH} rows a batch")
    right.legend(loc="lower left", fontsize=8, frameon=False)
    return fig


FIGURES: dict[str, Callable[[pathlib.Path], Figure]] = {
    "order.svg": order_figure,
    "mixture.svg": mixture_figure,
    "packing.svg": packing_figure,
}


def write_figures(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Draw every figure into ``out_dir`` (created if missing); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with matplotlib.rc_context(STYLE), tempfile.TemporaryDirectory() as tmp:
        for name, draw in FIGURES.items():
            work = pathlib.Path(tmp) / name.removesuffix(".svg")
            work.mkdir()
            fig = draw(work)
            fig.savefig(out_dir / name, format="svg", metadata={"Date": None})
            plt.close(fig)
            written.append(out_dir / name)
    return written


if __name__ == "__main__":
    for path in write_figures(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURES_DIR):
        print(path)
