"""One process of a multi-process JAX run over loopback, driven by tests/test_multiprocess.py.

Usage: ``python multiprocess_worker.py PLAN.json PROCESS_ID``. The plan (JSON) holds::

    {"port": int, "num_processes": int, "corpus": path or {name: path}, "out_dir": path,
     "pipeline": {TokenPipeline keyword arguments; "phases": [{Phase keyword arguments}]},
     "runs": [{"tag": str, "read": int,
               "restore": {"dir": path, "step": int} | null,
               "save": {"dir": path, "after": int} | null}, ...]}

Each run builds a fresh ``MultiHostDataLoadIterator``, optionally restores it with Orbax
(``RoxCheckpointRestore``), reads ``read`` global batches, optionally saves with Orbax
(``RoxCheckpointSave``) after ``after`` of them, and writes ``OUT_DIR/TAG_pID.npz`` with, per
batch and feature, this process's rows (from its addressable shards) and the whole global
array (``process_allgather``), plus a JSON ``meta`` record. JAX's distributed runtime is
initialised before anything else touches JAX.
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.2f}s] {message}", file=sys.stderr, flush=True)


def main() -> None:
    plan_path, process_id = sys.argv[1], int(sys.argv[2])
    with open(plan_path) as f:
        plan = json.load(f)

    import jax

    log("jax imported")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{plan['port']}",
        num_processes=plan["num_processes"],
        process_id=process_id,
        initialization_timeout=60,
    )

    log("distributed initialised")
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    import grain_rox

    assert jax.process_count() == plan["num_processes"], jax.process_count()
    assert jax.process_index() == process_id, jax.process_index()
    log(f"grain_rox imported from {grain_rox.__file__}")
    config = dict(plan["pipeline"])
    if "phases" in config:  # a curriculum: Phase keyword arguments, in order
        config["phases"] = [grain_rox.Phase(**phase) for phase in config["phases"]]
    pipeline = grain_rox.TokenPipeline(plan["corpus"], **config)
    first_batch = (plan["pipeline"].get("phases") or [plan["pipeline"]])[0]
    first_batch = first_batch.get("global_batch_size") or first_batch["batch_size"]

    for run in plan["runs"]:
        log(f"run {run['tag']}")
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, object] = {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "local_device_count": jax.local_device_count(),
            "device_count": jax.device_count(),
        }
        # features_on_device: True in the 2-process wave (the accelerator path: one array
        # placed, the features derived by one jit over the global array), the default (host
        # features on CPU devices) in the 4-process one.
        on_device = plan.get("features_on_device")
        with grain_rox.MultiHostDataLoadIterator(pipeline, features_on_device=on_device) as it:
            # The rows this process reads, for the (first) phase's batch size.
            meta["rows"] = list(it.local_rows[first_batch])
            meta["rows_by_batch_size"] = {str(n): list(r) for n, r in it.local_rows.items()}
            if run.get("restore"):
                manager = ocp.CheckpointManager(run["restore"]["dir"])
                manager.restore(
                    run["restore"]["step"],
                    args=ocp.args.Composite(data=grain_rox.RoxCheckpointRestore(it)),
                )
                manager.close()
            meta["start_step"] = it.step
            log(f"iterator ready at step {it.step}")
            shard_rows: list[list[list[int]]] = []
            global_shapes: dict[str, list[int]] = {}
            for i in range(run["read"]):
                if run.get("save") and i == run["save"]["after"]:
                    _save(ocp, grain_rox, run["save"]["dir"], it)
                batch = next(it)
                gathered = multihost_utils.process_allgather(batch, tiled=True)
                for key, x in batch.items():
                    global_shapes[key] = list(x.shape)
                    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
                    if key == "inputs":
                        shard_rows.append(
                            [[s.index[0].start, s.index[0].stop, s.data.shape[0]] for s in shards]
                        )
                    arrays[f"local__{key}__{i}"] = np.concatenate(
                        [np.asarray(s.data) for s in shards]
                    )
                    arrays[f"global__{key}__{i}"] = np.asarray(gathered[key])
            log(f"read {run['read']} batches")
            if run.get("save") and run["save"]["after"] == run["read"]:
                _save(ocp, grain_rox, run["save"]["dir"], it)
            meta["end_step"] = it.step
            meta["shard_rows"] = shard_rows
            meta["global_shapes"] = global_shapes
        arrays["meta"] = np.asarray(json.dumps(meta))
        np.savez(f"{plan['out_dir']}/{run['tag']}_p{process_id}.npz", **arrays)
    if plan.get("npy"):
        _npy_run(plan, process_id)
    log("runs done")
    multihost_utils.sync_global_devices("multiprocess_worker done")
    log("synced")


def _npy_run(plan: dict, process_id: int) -> None:
    """``NumpySource.batches`` sharded by process through ``MultiHostDataLoadIterator``."""
    import grain
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import grain_rox

    spec = plan["npy"]
    source = grain_rox.NumpySource(spec["path"])
    ds = source.batches(
        spec["batch"], seed=spec["seed"], num_epochs=-1,
        shard=(jax.process_index(), jax.process_count()),
    ).to_iter_dataset(grain.ReadOptions(num_threads=0))  # fmt: skip
    out = {}
    with grain_rox.MultiHostDataLoadIterator(ds) as it:
        for i in range(spec["read"]):
            batch = next(it)
            shards = sorted(batch.addressable_shards, key=lambda s: s.index[0].start or 0)
            out[f"local__{i}"] = np.concatenate([np.asarray(s.data) for s in shards])
            out[f"global__{i}"] = np.asarray(multihost_utils.process_allgather(batch, tiled=True))
    np.savez(f"{plan['out_dir']}/npy_p{process_id}.npz", **out)
    log(f"npy: read {spec['read']} batches")


def _save(ocp, grain_rox, directory: str, it) -> None:
    manager = ocp.CheckpointManager(directory)
    manager.save(it.step, args=ocp.args.Composite(data=grain_rox.RoxCheckpointSave(it)))
    manager.wait_until_finished()
    manager.close()
    log(f"saved step {it.step} to {directory}")


if __name__ == "__main__":
    main()
