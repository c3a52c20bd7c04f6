"""The main job, end to end: `.rox` shards -> Grain -> sharded jax.Arrays -> a Flax LM.

    python examples/train_demo.py                 # the embedded default corpus
    python examples/train_demo.py --text my.txt --jsonl data.jsonl --rox more/*.rox
    python examples/train_demo.py --hf my_saved_dataset/ --text-column text

1. Converts two sources to `.rox` with cl100k_base (the byte tokenizer if tiktoken is
   missing): the Python standard library's sources ("code") and its prose (pydoc topics and
   long docstrings), or your own files.
2. Mixes them with weights over two curriculum phases (seq_len 128, then 256), with EOS
   segmentation, through Grain into `MultiHostDataLoadIterator` on the accelerator (GPU or
   TPU) when there is one, else on 8 CPU devices, and says which.
3. Trains a small Flax NNX decoder-only LM (causal attention that never crosses documents)
   with optax (`--d-model`, `--layers`, `--heads`, `--batch` make it bigger); prints the
   input pipeline's batches/s, the step time, and the input stall: a step fed by the
   pipeline vs a step on a batch already on the device.
4. Checkpoints model, optimizer and data with Orbax at step N, resumes in a fresh process, and
   checks that the continued batches and losses equal the uninterrupted run's, bit for bit.
"""
# ruff: noqa: E402  (the devices are chosen before JAX is imported)

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def choose_devices(argv: list[str]) -> None:
    """The accelerator when there is one (GPU or TPU), else 8 fake CPU devices; ``--platform
    cpu`` forces the CPU. Set before JAX starts, and inherited by the resume process:

    * the fake-device count only shapes the CPU platform, so it is always set;
    * ``--xla_gpu_deterministic_ops``: a GPU's reductions otherwise may add in a different
      order from run to run, and a resumed run's losses would differ in the last bits (every
      trainer that wants bit-exact resumes on a GPU needs it);
    * no preallocation: the resume process shares the device with its parent, which would
      otherwise hold 75% of the GPU's memory.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in ("--xla_force_host_platform_device_count=8", "--xla_gpu_deterministic_ops=true"):
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if "--platform" in argv and argv[argv.index("--platform") + 1 :][:1] == ["cpu"]:
        os.environ["JAX_PLATFORMS"] = "cpu"


choose_devices(sys.argv)

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import grain_rox

VOCAB = 4096  # the model's vocabulary: the corpus's most frequent tokenizer ids, + 1 for "other"


# ---- data ---------------------------------------------------------------------------------
def pick_tokenizer() -> grain_rox.Tokenizer:
    try:
        tok = grain_rox.get_tokenizer("cl100k_base")
        tok.encode("probe")
        return tok
    except ImportError as e:
        print(f"note: {e}; using the byte tokenizer instead")
        return grain_rox.get_tokenizer("bytes")


def build_sources(args: argparse.Namespace, out: str) -> dict[str, str]:
    """Write (once) the demo's two sources as .rox shard sets; returns {name: path}."""
    tok = pick_tokenizer()
    user = [*args.text, *args.jsonl, *args.hf]
    specs = {"code": ("builtin", "code"), "prose": ("builtin", "prose")}
    if user:
        specs = {"yours": ("files", user), "prose": ("builtin", "prose")}
    paths = {}
    for name, (kind, what) in specs.items():
        path = os.path.join(out, f"{name}.rox")
        paths[name] = path
        if os.path.exists(os.path.join(out, f"{name}.manifest.json")):
            continue
        if kind == "builtin":
            docs = grain_rox.builtin_documents(what)
        else:
            docs = grain_rox.read_documents(what, text_column=args.text_column)
        result = grain_rox.write_rox(docs, path, tokenizer=tok, max_shard_bytes=16 << 20)
        print(f"wrote {name}: {result.num_documents} documents, {result.num_tokens:,} tokens")
    for i, spec in enumerate(args.rox):
        paths[f"rox{i}"] = spec
    return paths


def vocabulary(paths: dict[str, str]) -> tuple[np.ndarray, int]:
    """A lookup table: tokenizer id -> model id (the VOCAB - 1 most frequent ids, 0 = other)."""
    counts = np.zeros(1, np.int64)
    eos = 0
    for spec in paths.values():
        with grain_rox.open_rox(spec) as corpus:
            eos = corpus.eos_id or 0
            for s in range(len(corpus.shards)):
                c = np.bincount(corpus.shard_tokens(s))
                if c.size > counts.size:
                    counts = np.pad(counts, (0, c.size - counts.size))
                counts[: c.size] += c
    counts[eos] = counts.max() + 1  # EOS always has its own id
    keep = np.argsort(-counts, kind="stable")[: VOCAB - 1]
    table = np.zeros(counts.size, np.int32)
    table[keep] = np.arange(1, keep.size + 1, dtype=np.int32)
    return table, int(table[eos])


def pipeline(
    paths: dict[str, str],
    steps: tuple[int, int | None],
    batch: int = 16,
    packing: str | None = None,
) -> grain_rox.TokenPipeline:
    names = list(paths)
    first = {names[0]: 0.7, names[1]: 0.3}
    second = {names[0]: 0.5, names[1]: 0.5}
    for extra in names[2:]:
        first[extra] = second[extra] = 0.2
    return grain_rox.TokenPipeline(
        paths,
        phases=[
            grain_rox.Phase(steps=steps[0], batch_size=batch, seq_len=128, weights=first),
            grain_rox.Phase(steps=steps[1], batch_size=batch // 2, seq_len=256, weights=second),
        ],
        seed=0,
        # one array a batch (packed rows too: their joins and padding ride in a few columns),
        # the features derived in the jitted step
        layout="tokens",
        packing=packing,  # None: rows of concatenated text; "best_fit": whole documents
    )


# ---- the model ----------------------------------------------------------------------------
class Block(nnx.Module):
    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=heads, in_features=dim, decode=False, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attention(self.norm1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class TinyLM(nnx.Module):
    """A decoder-only LM; attention is causal and stays inside each document (segment)."""

    def __init__(
        self, *, vocab: int, dim: int, depth: int, heads: int, max_len: int, rngs: nnx.Rngs
    ) -> None:
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.position = nnx.Embed(max_len, dim, rngs=rngs)
        self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, tokens: jax.Array, segments: jax.Array, positions: jax.Array) -> jax.Array:
        same = segments[:, :, None] == segments[:, None, :]
        causal = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))
        mask = (same & causal)[:, None]
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.embed.attend(self.norm(x))


def loss_fn(model: TinyLM, batch: dict[str, jax.Array], table: jax.Array) -> jax.Array:
    inputs = jnp.take(table, batch["inputs"])
    targets = jnp.take(table, batch["targets"])
    logits = model(inputs, batch["inputs_segmentation"], batch["inputs_position"])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weight = (batch["targets_segmentation"] != 0).astype(jnp.float32)
    return (losses * weight).sum() / jnp.maximum(weight.sum(), 1.0)


def make_train_step(pipe: grain_rox.TokenPipeline):
    """The jitted step; it derives the MaxText features from the batch's one array itself."""

    @nnx.jit
    def train_step(model: TinyLM, optimizer: nnx.Optimizer, batch: dict, table: jax.Array):
        features = pipe.unpack(batch)  # inputs, targets, segmentation, positions
        loss, grads = nnx.value_and_grad(loss_fn)(model, features, table)
        optimizer.update(model, grads)
        return loss

    return train_step


def make_model(args: argparse.Namespace) -> tuple[TinyLM, nnx.Optimizer]:
    model = TinyLM(
        vocab=VOCAB, dim=args.d_model, depth=args.layers, heads=args.heads, max_len=256,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    optimizer = nnx.Optimizer(model, optax.adamw(2e-3), wrt=nnx.Param)
    return model, optimizer


def digest(batch: dict[str, jax.Array]) -> str:
    h = hashlib.sha1()
    for key in sorted(batch):
        h.update(np.asarray(batch[key]).tobytes())
    return h.hexdigest()[:16]


# ---- the run ------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict:
    paths = json.loads(open(os.path.join(args.out, "sources.json")).read())
    table_np, _ = vocabulary(paths)
    pipe = pipeline(paths, (args.phase1, args.phase2), args.batch, args.packing)
    total = args.phase1 + args.phase2
    batches = grain_rox.MultiHostDataLoadIterator(pipe, prefetch=4)
    train_step = make_train_step(pipe)
    mesh = batches.mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    table = jax.device_put(jnp.asarray(table_np), replicated)
    model, optimizer = make_model(args)
    # Parameters and optimizer state replicated over the mesh the batches are sharded on.
    nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)), replicated))
    manager = ocp.CheckpointManager(os.path.join(args.out, "checkpoints"))
    start = 0
    if args.resume:

        def target(tree):
            return jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree
            )

        restored = manager.restore(
            args.checkpoint_step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(target(nnx.state(model))),
                optimizer=ocp.args.StandardRestore(target(nnx.state(optimizer))),
                data=grain_rox.RoxCheckpointRestore(batches),
            ),
        )
        nnx.update(model, restored["model"])
        nnx.update(optimizer, restored["optimizer"])
        start = batches.step
    losses, digests, step_times = {}, {}, []
    from tqdm.auto import tqdm

    fed_times = []  # next(batches) + the step: what the trainer waits for
    bar = tqdm(range(start, total), desc="training", unit="step", disable=None)
    for step in bar:
        t_fed = time.perf_counter()
        batch = next(batches)
        t0 = time.perf_counter()
        loss = float(train_step(model, optimizer, batch, table))
        step_times.append(time.perf_counter() - t0)
        fed_times.append(time.perf_counter() - t_fed)
        losses[step], digests[step] = loss, digest(batch)
        bar.set_postfix(loss=f"{loss:.3f}")
        if not args.resume and step + 1 == args.checkpoint_step:
            manager.save(
                step + 1,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(nnx.state(model)),
                    optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
                    data=grain_rox.RoxCheckpointSave(batches),
                ),
            )
            manager.wait_until_finished()
    bar.close()
    batches.close()
    manager.close()
    result = {"losses": losses, "digests": digests, "step_time": float(np.median(step_times))}
    if not args.resume:  # the input stall: the last phase's steps fed vs a resident batch
        tail = fed_times[-min(len(fed_times), args.phase2, 50) :]
        resident = []
        for _ in range(len(tail)):  # (this trains further on one batch: after everything)
            t0 = time.perf_counter()
            float(train_step(model, optimizer, batch, table))
            resident.append(time.perf_counter() - t0)
        result["fed_step_time"] = float(np.median(tail))
        result["resident_step_time"] = float(np.median(resident))
    return result


def pipeline_rate(
    paths: dict[str, str], first_phase: int, count: int, batch: int, packing: str | None
) -> float:
    endless = pipeline(paths, (first_phase, None), batch, packing)  # type: ignore[arg-type]
    with grain_rox.MultiHostDataLoadIterator(endless, prefetch=4) as it:
        jax.block_until_ready(next(it))
        t0 = time.perf_counter()
        for _ in range(count):
            jax.block_until_ready(next(it))
        return count / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="demo_out")
    parser.add_argument("--text", nargs="*", default=[], help="your text files/directories")
    parser.add_argument("--jsonl", nargs="*", default=[], help="your JSONL/Parquet files")
    parser.add_argument(
        "--hf", nargs="*", default=[], help="HF datasets saved with save_to_disk (directories)"
    )
    parser.add_argument("--text-column", default="text", help="JSONL/Parquet/HF text field")
    parser.add_argument("--rox", nargs="*", default=[], help="extra .rox shard sets to mix in")
    parser.add_argument("--phase1", type=int, default=150)
    parser.add_argument("--phase2", type=int, default=150)
    parser.add_argument("--checkpoint-step", type=int, default=200)
    parser.add_argument("--min-loss-drop", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=16, help="phase 1 rows (phase 2: half)")
    parser.add_argument("--d-model", type=int, default=96, help="the model's width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument(
        "--platform", choices=("auto", "cpu"), default="auto",
        help="auto: the accelerator if there is one, else 8 CPU devices",
    )  # fmt: skip
    parser.add_argument(
        "--packing",
        choices=["best_fit", "first_fit"],
        default=None,
        help="rows of whole documents, packed in the global order (default: concatenated text)",
    )
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)  # Orbax wants absolute checkpoint paths
    os.makedirs(args.out, exist_ok=True)

    if args.resume:  # the fresh process: continue from the checkpoint, report, exit
        result = run(args)
        with open(args.report, "w") as f:
            json.dump(result, f)
        return 0

    t0 = time.perf_counter()
    paths = build_sources(args, args.out)
    with open(os.path.join(args.out, "sources.json"), "w") as f:
        json.dump(paths, f)
    convert_s = time.perf_counter() - t0
    device = f"{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})"
    print(f"devices: {device}")
    rate = pipeline_rate(paths, args.phase1, 200, args.batch, args.packing)
    print(f"input pipeline: {rate:,.0f} global batches/s through Grain onto {device}")

    first = run(args)
    report = os.path.join(args.out, "resumed.json")
    if os.path.exists(report):
        os.remove(report)
    print(f"restarting from the step-{args.checkpoint_step} checkpoint in a fresh process...")
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--out",
            args.out,
            "--phase1",
            str(args.phase1),
            "--phase2",
            str(args.phase2),
            "--checkpoint-step",
            str(args.checkpoint_step),
            *("--batch", str(args.batch), "--d-model", str(args.d_model)),
            *("--layers", str(args.layers), "--heads", str(args.heads)),
            *(["--platform", "cpu"] if args.platform == "cpu" else []),
            *(["--packing", args.packing] if args.packing else []),
            "--resume",
            "--report",
            report,
        ],
        check=True,
    )
    second = json.load(open(report))
    resumed = {int(k): v for k, v in second["losses"].items()}
    same_losses = all(first["losses"][k] == v for k, v in resumed.items())
    same_batches = all(first["digests"][int(k)] == v for k, v in second["digests"].items())
    losses = first["losses"]
    steps = sorted(losses)
    head, tail = np.mean([losses[s] for s in steps[:20]]), np.mean([losses[s] for s in steps[-20:]])
    rows = [
        ("sources", ", ".join(paths)),
        ("conversion", f"{convert_s:.1f} s"),
        ("devices", device),
        (
            "steps (phase 1 | phase 2)",
            f"{args.phase1} x ({args.batch}, 128) | {args.phase2} x ({args.batch // 2}, 256)",
        ),
        ("rows", f"whole documents, packed ({args.packing})" if args.packing else "concatenated"),
        ("input pipeline", f"{rate:,.0f} batches/s"),
        ("train step (median)", f"{first['step_time'] * 1e3:.1f} ms"),
        (
            "input stall (phase 2)",
            f"{first['fed_step_time'] * 1e3:.1f} ms a step fed by the pipeline vs "
            f"{first['resident_step_time'] * 1e3:.1f} ms on a resident batch "
            f"({first['fed_step_time'] / first['resident_step_time'] - 1:+.0%})",
        ),
        ("loss, first 20 -> last 20 steps", f"{head:.3f} -> {tail:.3f}"),
        ("resumed steps compared", f"{len(resumed)} (from step {args.checkpoint_step})"),
        ("batches bit-identical after resume", str(same_batches)),
        ("losses bit-identical after resume", str(same_losses)),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nsummary")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    ok = same_batches and same_losses and tail < head - args.min_loss_drop
    print("\nOK" if ok else "\nFAILED: the loss did not fall clearly or the resume differed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
