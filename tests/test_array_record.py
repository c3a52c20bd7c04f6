"""ArrayRecordSource and export: token documents and fixed-shape rows in ArrayRecord files,
written with array_record's own writer; conversion both ways through the CLI. (The index,
pickle and read-only protocols: every source, in test_conformance.py.)"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle

import grain
import numpy as np
import pytest
from _corpora import random_documents
from _kill_points import child_env
from array_record.python.array_record_module import ArrayRecordWriter

from grain_rox import (
    ArrayRecordSource,
    RoxDocumentSource,
    export_array_record,
    mix_datasets,
    open_rox,
    pack_documents,
    testing,
    write_rox,
)
from grain_rox.cli import main

SHORT_DOCS = [np.arange(1, n + 1, dtype=np.uint16) for n in (3, 9, 4, 12, 6, 2, 7, 5)]


def write_records(path, arrays, options="group_size:1"):
    writer = ArrayRecordWriter(str(path), options)
    for a in arrays:
        writer.write(a if isinstance(a, bytes) else np.ascontiguousarray(a).tobytes())
    writer.close()
    return str(path)


def documents(n, seed=0):
    return random_documents(seed, n, lengths=(1, 40), high=5000)


@pytest.fixture(scope="module")
def rox_of_900s(make_rox):
    """Ten documents of five 900s."""
    return make_rox("r", [np.full(5, 900, np.uint16)] * 10, separator=0, block_size=64)


@pytest.mark.parametrize("options", ["group_size:1", "group_size:64,uncompressed"])
def test_token_documents_across_files_globs_and_lists(tmp_path, options):
    docs = documents(150)
    a = write_records(tmp_path / "part-0.array_record", docs[:100], options)
    b = write_records(tmp_path / "part-1.array_record", docs[100:], options)
    for paths in (str(tmp_path / "part-*.array_record"), [a, b]):
        src = ArrayRecordSource(paths, dtype=np.uint16)
        assert len(src) == 150 and src.counts == [100, 50]
        assert np.array_equal(src[0], docs[0]) and np.array_equal(src[149], docs[149])
        picked = src._getitems([120, 3, 3, 99, 100])
        assert [p.tolist() for p in picked] == [docs[i].tolist() for i in (120, 3, 3, 99, 100)]
        assert [d.tolist() for d in src.iter_arrays(chunk=7)] == [d.tolist() for d in docs]
    testing.check_pickle(src, max_bytes=2_000)
    assert "2 files, 150 records, uint16, documents" in repr(src)
    with pytest.raises(IndexError, match=r"^record 150 is out of range for 150 records"):
        src[150]
    with pytest.raises(IndexError, match=r"records \[150\] are out of range for 150 records"):
        src._getitems([0, 150])


def test_fixed_shape_rows_as_loaderx_writes_them(tmp_path):
    rows = np.arange(64 * 3 * 4, dtype=np.int32).reshape(64, 3, 4)
    path = write_records(tmp_path / "train_data.ar", rows, "group_size:1,zstd")
    src = ArrayRecordSource(path, dtype=np.int32, shape=(3, 4))
    assert np.array_equal(src[5], rows[5])
    with pytest.raises(IndexError, match=r"^record 64 is out of range for 64 records"):
        src[64]
    assert np.array_equal(src.get_batch([7, 0, 63]), rows[[7, 0, 63]])
    ds = src.batches(16, seed=2, num_epochs=-1)
    epoch = np.concatenate([ds[i] for i in range(4)])
    assert sorted(epoch[:, 0, 0].tolist()) == rows[:, 0, 0].tolist()
    assert not np.array_equal(epoch, np.concatenate([ds[i] for i in range(4, 8)]))
    halves = [src.batches(16, seed=2, num_epochs=-1, shard=(i, 2)) for i in range(2)]
    assert np.array_equal(np.concatenate([h[6] for h in halves]), ds[6])
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]
    again = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    again.set_state(state)
    assert all(np.array_equal(next(again), e) for e in expected)


def test_npy_records_describe_themselves(tmp_path):
    import io

    arrays = [np.full((i + 1, 2), i, np.float32) for i in range(5)]
    blobs = []
    for a in arrays:
        buf = io.BytesIO()
        np.save(buf, a)
        blobs.append(buf.getvalue())
    path = write_records(tmp_path / "npy.array_record", blobs)
    src = ArrayRecordSource(path, encoding="npy")
    assert src[3].shape == (4, 2) and src[3].dtype == np.float32
    with pytest.raises(
        ValueError, match=r"npy.array_record: record 0 holds float32, not dtype=int16"
    ):
        ArrayRecordSource(path, encoding="npy", dtype=np.int16)[0]


def npy_image(array):
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_a_npy_image_read_as_raw_values_is_refused_on_every_read_path(tmp_path, capsys):
    """With the default raw encoding a record that np.save wrote was served as tokens, its
    header included (69 uint16 "tokens" for a 5-token document); values that merely begin
    with the magic's bytes are still served."""
    image = npy_image(np.arange(1, 6, dtype=np.uint16))
    lookalike = b"\x93NUMPY" + bytes(10)  # raw uint16 values that begin like an image
    path = write_records(tmp_path / "n.array_record", [np.arange(3, dtype=np.uint16), image,
                                                       lookalike])  # fmt: skip
    src = ArrayRecordSource(path, dtype=np.uint16)
    refused = r"n.array_record: record 1 is a \.npy file image .*read it with ArrayRecordSource\(\.\.\., encoding='npy'\)"
    assert src[0].tolist() == [0, 1, 2]
    assert src[2].tolist() == np.frombuffer(lookalike, np.uint16).tolist()
    for read in (lambda: src[1], lambda: src._getitems([0, 1]), lambda: list(src.iter_arrays())):
        with pytest.raises(ValueError, match=refused):
            read()
    with pytest.raises(ValueError, match=refused):
        src.get_batch([1, 1])  # documents: stacked one by one
    assert ArrayRecordSource(path, encoding="npy")[1].tolist() == [1, 2, 3, 4, 5]
    rows = np.arange(len(image) // 2 * 3, dtype=np.uint16).reshape(3, -1)  # rows as long as it
    fixed = write_records(tmp_path / "f.array_record", [rows[0], image, rows[2]])
    shaped = ArrayRecordSource(fixed, dtype=np.uint16, shape=rows.shape[1:])
    assert shaped.get_batch([2, 0]).tolist() == rows[[2, 0]].tolist()
    with pytest.raises(ValueError, match=refused.replace("n.array", "f.array")):
        shaped.get_batch([0, 1, 2])  # the one-copy path for whole batches
    out = str(tmp_path / "n.rox")
    code = main(["convert", path, "-o", out, "--record-dtype", "uint16", "--tokenizer",
                 "cl100k_base", "--no-progress"])  # fmt: skip
    assert code == 2 and not os.path.exists(out)
    err = capsys.readouterr().err
    assert "record 1 is a .npy file image" in err and "encoding='npy'" in err


def test_documents_pack_and_mix_beside_rox_documents(tmp_path, rox_of_900s):
    docs = SHORT_DOCS
    path = write_records(tmp_path / "d.array_record", docs)
    src = ArrayRecordSource(path, dtype=np.uint16)
    batches = list(pack_documents(src, seq_len=16, batch_size=2, num_epochs=1, shuffle=False))
    served = collections.Counter()
    for b in batches:
        for row, seg in zip(b["inputs"], b["inputs_segmentation"], strict=True):
            served.update(tuple(row[seg == s].tolist()) for s in np.unique(seg[seg > 0]))
    # each packed segment is a whole document's inputs (tokens[:-1]), none invented
    assert not served - collections.Counter(tuple(d[:-1].tolist()) for d in docs if d.size > 1)
    assert sum(served.values()) >= 5
    mixed = mix_datasets(
        {
            "ar": grain.MapDataset.source(src),
            "rox": grain.MapDataset.source(RoxDocumentSource(rox_of_900s, seq_len=16)),
        },
        {"ar": 0.5, "rox": 0.5},
        length=16,
    )
    tokens = np.concatenate(
        [
            b["inputs"][b["inputs_segmentation"] > 0]
            for b in pack_documents(mixed, seq_len=16, batch_size=2, num_epochs=1)
        ]
    )
    assert (tokens == 900).any() and ((tokens > 0) & (tokens < 13)).any()


def test_bad_input_names_the_file_and_record(tmp_path):
    good = write_records(tmp_path / "ok.array_record", [np.arange(4, dtype=np.int32)] * 3)
    with pytest.raises(FileNotFoundError) as info:
        ArrayRecordSource([good, str(tmp_path / "gone.ar"), str(tmp_path / "x*.ar")], dtype="int32")
    assert "gone.ar" in str(info.value) and "x*.ar (matches nothing)" in str(info.value)
    odd = write_records(tmp_path / "odd.array_record", [b"\x01\x02\x03", b"\x00" * 8])
    with pytest.raises(
        ValueError, match=r"odd.array_record: record 0 holds 3 bytes, not a whole number of int32"
    ):
        ArrayRecordSource(odd, dtype=np.int32)[0]
    with pytest.raises(
        ValueError,
        match=r"ok.array_record: record 1 holds 4 values of shape \(4,\), which does not match shape=\(2, 3\)",
    ):
        ArrayRecordSource(good, dtype=np.int32, shape=(2, 3))[1]
    with pytest.raises(ValueError, match="raw records need their dtype"):
        ArrayRecordSource(good)
    with pytest.raises(ValueError, match="batches\\(\\) stacks fixed-shape records"):
        ArrayRecordSource(good, dtype=np.int32).batches(2)
    truncated = tmp_path / "cut.array_record"
    rng = np.random.default_rng(0)
    blob = [rng.integers(0, 2**31, 1024, dtype=np.int32) for _ in range(100)]
    write_records(truncated, blob, "group_size:1,uncompressed")
    whole = truncated.read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut.array_record: not a readable ArrayRecord file"):
        ArrayRecordSource(str(truncated), dtype=np.int32)
    flipped = tmp_path / "flip.array_record"
    data = bytearray(whole)
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(16)
    flipped.write_bytes(bytes(data))
    src = ArrayRecordSource(str(flipped), dtype=np.int32)
    failures = []
    for i in range(100):
        try:
            src[i]
        except ValueError as e:
            failures.append((i, str(e)))
    assert failures and all(
        "flip.array_record: record" in m and "damaged" in m for _, m in failures
    )
    assert 0 < len(failures) < 100 and failures[0][0] > 0  # records before the damage read


def test_convert_both_ways_through_the_cli(tmp_path, capsys):
    docs = documents(300, seed=3)
    src = write_records(tmp_path / "docs.array_record", docs)
    rox = str(tmp_path / "docs.rox")
    assert (
        main(
            [
                "convert",
                src,
                "-o",
                rox,
                "--record-dtype",
                "uint16",
                "--tokenizer",
                "cl100k_base",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "wrote 300 documents" in out and "verified 1 shard(s): checksums match" in out
    corpus = open_rox(rox)
    eos = corpus.eos_id
    assert eos == 100257 and corpus.num_documents == 300
    joined = np.concatenate([np.append(d, eos) for d in docs])
    assert np.array_equal(corpus.tokens(0, joined.size), joined.astype(corpus.dtype))
    back = str(tmp_path / "back.array_record")
    assert main(["export", rox, "-o", back, "--no-progress"]) == 0
    assert "wrote 300 documents" in capsys.readouterr().out
    again = ArrayRecordSource(back, dtype=corpus.dtype)
    assert [a.tolist() for a in again.iter_arrays()] == [d.tolist() for d in docs]
    assert main(["export", rox, "-o", back, "--no-progress"]) == 2
    assert "exists; pass overwrite=True" in capsys.readouterr().err
    assert main(["convert", src, "-o", str(tmp_path / "x.rox"), "--no-progress"]) == 2
    assert "pass --record-dtype" in capsys.readouterr().err


def test_export_splits_across_shards_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    docs = [np.arange(1, n, dtype=np.uint16) for n in range(2, 60)]
    base = str(tmp_path / "s.rox")
    result = write_rox(docs, base, separator=0, block_size=32, max_shard_bytes=256)
    assert len(result.paths) > 3  # documents cross shard boundaries
    r = export_array_record(base, str(tmp_path / "s.array_record"), eos_id=0, group_size=8)
    assert r.num_documents == len(docs)
    got = ArrayRecordSource(r.path, dtype=np.uint16).iter_arrays()
    assert [g.tolist() for g in got] == [d.tolist() for d in docs]
    import grain_rox._sources._array_record_export as export_module

    real = export_module.rox_documents

    def dies_half_way(corpus, eos):
        for i, doc in enumerate(real(corpus, eos)):
            if i == 20:
                raise KeyboardInterrupt
            yield doc

    monkeypatch.setattr(export_module, "rox_documents", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        export_array_record(base, str(tmp_path / "half.array_record"), eos_id=0)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(p) for p in result.paths] + ["s.array_record", "s.manifest.json"]
    )


def test_curriculum_of_array_record_and_rox_documents_packs_and_resumes(tmp_path, rox_of_900s):
    path = write_records(tmp_path / "d.array_record", SHORT_DOCS)
    src = ArrayRecordSource(path, dtype=np.uint16)
    datasets = {
        "ar": grain.MapDataset.source(src),
        "rox": grain.MapDataset.source(RoxDocumentSource(rox_of_900s, seq_len=16)),
    }
    phased = mix_datasets(datasets, phases=[(16, {"ar": 1.0}), (None, {"rox": 1.0})], length=32)
    packed = pack_documents(phased, seq_len=16, batch_size=1, num_epochs=1, shuffle=False)
    batches = list(packed)
    real = [b["inputs"][b["inputs_segmentation"] > 0] for b in batches]
    switch = next(i for i, t in enumerate(real) if (t == 900).any())
    assert all((t < 13).all() for t in real[:switch])  # phase 1: ArrayRecord documents only
    assert all((t == 900).all() for t in real[switch + 1 :])  # phase 2: .rox documents only
    it = iter(packed)
    for _ in range(switch):
        next(it)
    state = it.get_state()
    rest = [b["inputs"].tolist() for b in it]
    again = iter(packed)
    again.set_state(state)
    assert [b["inputs"].tolist() for b in again] == rest


def test_documents_of_different_dtypes_pack_without_wrapping(tmp_path):
    small = ArrayRecordSource(
        write_records(tmp_path / "u16.array_record", [np.arange(1, 6, dtype=np.uint16)] * 4),
        dtype=np.uint16,
    )
    big = grain.MapDataset.source([np.array([70_000, 70_001, 70_002], np.int32)] * 4)
    mixed = mix_datasets(
        {"small": grain.MapDataset.source(small), "big": big}, {"small": 0.5, "big": 0.5}, length=8
    )
    packed = list(pack_documents(mixed, seq_len=8, batch_size=1, num_epochs=1, shuffle=False))
    tokens = np.concatenate([b["inputs"][b["inputs_segmentation"] > 0] for b in packed])
    assert tokens.dtype == np.int32 and 70_000 in tokens.tolist() and 1 in tokens.tolist()
    phased = mix_datasets(
        {"small": grain.MapDataset.source(small), "big": big},
        phases=[(2, {"small": 1.0}), (None, {"big": 1.0})],
        length=4,
    )
    repeated = [np.asarray(x).tolist() for x in phased.repeat(2)]  # past the end: last phase
    assert repeated[:2] == [[1, 2, 3, 4, 5]] * 2 and repeated[4:] == [[70_000, 70_001, 70_002]] * 4


def test_convert_refuses_ids_outside_the_tokenizer_vocabulary(tmp_path, capsys):
    src = write_records(tmp_path / "big.array_record", [np.array([5, 70_000, 6], np.uint32)])
    code = main(["convert", src, "-o", str(tmp_path / "b.rox"), "--record-dtype", "uint32",
                 "--no-progress"])  # fmt: skip
    assert code == 2
    assert f"item 0 ({src}: record 0) holds token id 70000, outside the bytes vocabulary " in (
        capsys.readouterr().err
    )
    assert not os.path.exists(tmp_path / "b.rox")
    with pytest.raises(ValueError, match="token id -1, outside the bytes vocabulary"):
        write_rox([np.array([3, -1])], str(tmp_path / "n.rox"), tokenizer="bytes")


def test_export_drops_the_padding_of_every_write_not_just_the_last(tmp_path):
    base = str(tmp_path / "p.rox")
    write_rox([np.array([5, 6, 7], np.uint16)], base, separator=0, pad_id=1, block_size=16)
    write_rox([np.array([8, 9], np.uint16)], base, separator=0, pad_id=1, block_size=16,
              if_exists="append")  # fmt: skip
    corpus = open_rox(base)  # one shard: [5 6 7 0 1 1 1 1] [8 9 0 1 1 1 1 1] (appended block)
    assert corpus.pad_id == 1 and corpus.tokens(0, 10).tolist() == [5, 6, 7, 0, 1, 1, 1, 1, 8, 9]
    r = export_array_record(base, str(tmp_path / "p.array_record"))
    got = [a.tolist() for a in ArrayRecordSource(r.path, dtype=np.uint16).iter_arrays()]
    assert got == [[5, 6, 7], [8, 9]]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    sharded = str(tmp_path / "s.rox")  # the same across shards, each padded at its end
    for i, doc in enumerate(([5, 6, 7], [8, 9])):
        write_rox([np.array(doc, np.uint16)], sharded, separator=0, pad_id=1, block_size=16,
                  max_shard_bytes=16, if_exists="append" if i else "error")  # fmt: skip
    assert len(open_rox(sharded).shards) == 2
    r = export_array_record(sharded, str(tmp_path / "s.array_record"))
    got = [a.tolist() for a in ArrayRecordSource(r.path, dtype=np.uint16).iter_arrays()]
    assert got == [[5, 6, 7], [8, 9]]


PAD_LED = [  # documents that start or end with the pad id 0, are only the pad id, or empty
    np.array([0, 0, 5, 6], np.uint16),
    np.array([3, 4], np.uint16),
    np.array([0], np.uint16),
    np.array([], np.uint16),
    np.array([0, 9], np.uint16),
    np.array([8, 0, 0], np.uint16),
]


def exported(rox, out, **kwargs):
    r = export_array_record(rox, str(out), **kwargs)
    got = [a.tolist() for a in ArrayRecordSource(r.path, dtype=r.dtype).iter_arrays()]
    assert r.num_documents == len(got) and r.num_tokens == sum(map(len, got))
    return got


@pytest.mark.parametrize("pad_id", [0, 7])  # a pad id that documents hold, and the EOS itself
def test_export_gives_exactly_the_documents_written(tmp_path, capsys, pad_id):
    """The manifest says where the padding is: a pad id inside a document is data (a leading
    one was taken for padding and dropped), and an empty document is an empty record."""
    single = str(tmp_path / "one.rox")
    write_rox(PAD_LED, single, separator=7, pad_id=pad_id, block_size=16)
    assert open_rox(single).num_documents == len(PAD_LED)
    assert exported(single, tmp_path / "one.array_record") == [d.tolist() for d in PAD_LED]
    assert main(["export", single, "-o", str(tmp_path / "cli.array_record"), "--no-progress"]) == 0
    assert f"wrote {len(PAD_LED)} documents, 12 tokens" in capsys.readouterr().out
    sharded = str(tmp_path / "set.rox")  # documents cross shards; each write pads its end
    twice = PAD_LED + PAD_LED[::-1]
    for i, docs in enumerate((PAD_LED, PAD_LED[::-1])):
        write_rox(docs, sharded, separator=7, pad_id=pad_id, block_size=8, max_shard_bytes=16,
                  if_exists="append" if i else "error")  # fmt: skip
    assert len(open_rox(sharded).shards) > 4
    assert exported(sharded, tmp_path / "set.array_record") == [d.tolist() for d in twice]
    from grain_rox._sources._array_record_export import rox_documents

    small_reads = rox_documents(open_rox(sharded), 7, chunk_tokens=3)  # documents span reads
    assert [d.tolist() for d in small_reads] == [d.tolist() for d in twice]
    appended = str(tmp_path / "app.rox")  # a single file: the first write's padding mid-stream
    for i, docs in enumerate((PAD_LED[:2], PAD_LED[2:])):
        write_rox(docs, appended, separator=7, pad_id=pad_id, block_size=32,
                  if_exists="append" if i else "error")  # fmt: skip
    assert open_rox(appended).padding_spans()[0][0]  # the mid-stream padding is recorded
    assert exported(appended, tmp_path / "app.array_record") == [d.tolist() for d in PAD_LED]


def test_export_of_shards_without_a_manifest_leaves_out_what_may_be_padding(tmp_path, caplog):
    """No manifest, no known padding: runs of EOS give no documents (roxxel pads with the
    separator), and tokens after the last EOS (roxxel pads with a pad id other than the EOS)
    are not exported but named in a warning, as RoxDocumentSource does; they were exported as
    a document of padding."""
    written = [d.tolist() for d in PAD_LED if d.size]
    for pad_id in (7, 0):
        path = str(tmp_path / f"bare{pad_id}.rox")
        write_rox(PAD_LED, path, separator=7, pad_id=pad_id, block_size=16, manifest=False)
        caplog.clear()
        got = exported(path, tmp_path / f"bare{pad_id}.array_record", eos_id=7)
        assert got == written
        warned = [r.getMessage() for r in caplog.records if "not exported" in r.getMessage()]
        if pad_id == 7:
            assert not warned
        else:
            assert len(warned) == 1 and "the last 6 tokens (from corpus offset 18)" in warned[0]
            assert "no manifest" in warned[0]
    loose = str(tmp_path / "loose.rox")  # roxxel's tokens: no manifest, no EOS at the end
    write_rox([np.array([5, 6, 8], np.uint16)], loose, block_size=8, manifest=False)
    caplog.clear()
    with pytest.raises(ValueError, match=r"no documents to export \(is eos_id=7 right\?\)"):
        export_array_record(loose, str(tmp_path / "loose.array_record"), eos_id=7)
    assert any("the last 4 tokens" in r.getMessage() for r in caplog.records)


def test_export_refuses_an_eos_id_its_tokens_cannot_hold(tmp_path, capsys):
    """An EOS id outside the dtype's range never matches a token: every document was exported
    as one record, EOS ids inside, and the export said it wrote 1 document."""
    path = str(tmp_path / "s.rox")
    write_rox([np.array([5, 6], np.uint16), np.array([8], np.uint16)], path, separator=7)
    for eos in (70000, -1):
        out = tmp_path / f"s{eos}.array_record"
        assert main(["export", path, "-o", str(out), "--eos-id", str(eos), "--no-progress"]) == 2
        assert capsys.readouterr().err == (
            f"grain-rox export: error: {path}: eos_id={eos} is outside the range of its uint16 "
            "tokens (0..65535), so no token ends a document; pass the EOS id the set was "
            "written with (eos_id=, --eos-id; by default the manifest's)\n"
        )
        assert not out.exists()
    assert exported(path, tmp_path / "s.array_record") == [[5, 6], [8]]
    floats = str(tmp_path / "f.rox")  # (roxxel writes float shards: no integer range there)
    write_rox([np.array([0.5, 2.0], np.float32), np.array([3.0], np.float32)], floats, separator=7)
    assert exported(floats, tmp_path / "f.array_record", eos_id=7) == [[0.5, 2.0], [3.0]]
    halves = str(tmp_path / "h.rox")  # a float EOS is kept as it is (int() made 0.5 the id 0)
    write_rox([np.array([0.0, 2.0], np.float32), np.array([3.0], np.float32)], halves,
              separator=0.5)  # fmt: skip
    assert exported(halves, tmp_path / "h.array_record") == [[0.0, 2.0], [3.0]]
    with pytest.raises(ValueError, match=r"eos_id=7.5 is not a whole number, and its tokens"):
        export_array_record(path, str(tmp_path / "w.array_record"), eos_id=7.5)


def test_stacking_documents_of_different_lengths_names_the_records(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) for n in (3, 3, 5, 3, 4)]
    src = ArrayRecordSource(write_records(tmp_path / "d.array_record", docs), dtype=np.uint16)
    assert src.get_batch([0, 1, 3]).shape == (3, 3)
    with pytest.raises(ValueError, match=r"record 0 has 3 tokens but records \[2, 4\] differ"):
        src.get_batch([0, 2, 3, 4])
    with pytest.raises(ValueError, match=r"^get_batch needs at least one index: no documents"):
        src.get_batch([])  # (np.stack said "need at least one array to stack")


def test_stacking_npy_records_of_different_dtypes_names_them_instead_of_casting(tmp_path):
    arrays = [np.array([2**63 - 1, 1]), np.array([2**64 - 1, 3], np.uint64), np.array([4, 5])]
    path = write_records(tmp_path / "n.array_record", [npy_image(a) for a in arrays])
    for shape in (None, (2,)):
        src = ArrayRecordSource(path, encoding="npy", shape=shape)
        assert src.get_batch([0, 2]).tolist() == [[2**63 - 1, 1], [4, 5]]  # int64 as stored
        with pytest.raises(
            ValueError,
            match=r"record 0 has dtype int64 but records \[1\] have uint64; stacking would cast",
        ):
            src.get_batch([0, 1, 2])  # (np.stack made float64: 2**63 - 1 became 2**63)


def test_stacking_npy_records_of_one_size_and_other_shapes_names_them(tmp_path):
    """(2, 3) and (6,) records pass the size check without shape=; numpy's bare 'all input
    arrays must have the same shape' named no record."""
    arrays = [np.zeros((2, 3), np.int8), np.zeros(6, np.int8), np.ones((2, 3), np.int8)]
    path = write_records(tmp_path / "s.array_record", [npy_image(a) for a in arrays])
    src = ArrayRecordSource(path, encoding="npy")
    assert src.get_batch([0, 2]).shape == (2, 2, 3)
    with pytest.raises(ValueError, match=r"^records have different shapes: record 0 has shape "
                       r"\(2, 3\) but records \[1\] have \(6,\); pass shape= "):  # fmt: skip
        src.get_batch([0, 1, 2])


def test_identity_is_content_and_a_rewritten_file_is_refused(tmp_path):
    import shutil

    rows = np.arange(60, dtype=np.int32).reshape(20, 3)
    path = write_records(tmp_path / "rows.array_record", rows)
    src = ArrayRecordSource(path, dtype=np.int32, shape=(3,))
    (tmp_path / "copy").mkdir()
    copied = shutil.copy(path, tmp_path / "copy" / "renamed.array_record")
    assert repr(ArrayRecordSource(str(copied), dtype=np.int32, shape=(3,))) == repr(src)
    worker = pickle.loads(pickle.dumps(src))  # a Grain worker opens its readers by path
    assert worker.get_batch([4, 5]).tolist() == rows[4:6].tolist()
    edited = rows.copy()
    edited[7, 1] = -1  # the same size, one value changed
    write_records(path, edited)
    assert repr(ArrayRecordSource(path, dtype=np.int32, shape=(3,))) != repr(src)
    message = r"rows.array_record changed after this ArrayRecordSource was made \(\d+ -> \d+ bytes"
    with pytest.raises(ValueError, match=message):
        worker.get_batch([7])  # its open reader: checked again at every batch
    with pytest.raises(ValueError, match=message):
        pickle.loads(pickle.dumps(src))[7]  # a new reader: checked as it opens


_EXPORT_KILLER = """
import sys
from _kill_points import kill_before
from grain_rox import export_array_record

rox, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
kill_before(n)
export_array_record(rox, out, overwrite=True)
"""


@pytest.mark.slow
def test_export_killed_at_any_rename_or_fsync_leaves_the_old_file_or_the_new_one(
    tmp_path, make_rox
):
    """SIGKILL before each os.replace/rename/unlink/remove/fsync of an overwriting export: the
    output is always a whole file, the previous export or the new one, never a partial one."""
    import subprocess
    import sys

    old_docs, new_docs = documents(30, seed=1), documents(50, seed=2)
    old_rox = make_rox("old", old_docs, separator=0)
    new_rox = make_rox("new", new_docs, separator=0)
    out = tmp_path / "out.array_record"

    def served() -> list[list[int]]:
        return [d.tolist() for d in ArrayRecordSource(str(out), dtype=np.uint16).iter_arrays()]

    old = [d.tolist() for d in old_docs]
    new = [d.tolist() for d in new_docs]
    outcomes = []
    for n in range(1, 50):
        if out.exists():
            out.unlink()
        export_array_record(old_rox, str(out))
        run = subprocess.run(
            [sys.executable, "-c", _EXPORT_KILLER, new_rox, str(out), str(n)], env=child_env()
        )
        got = served()
        assert got in (old, new), f"kill point {n}: the output is neither export"
        if run.returncode == 0:
            assert got == new
            outcomes.append("done")
            break
        assert run.returncode == -9, run.returncode
        outcomes.append("old" if got == old else "new")
    assert outcomes[-1] == "done" and "old" in outcomes, outcomes


def test_values_a_writer_or_packer_refuses_name_the_file_and_record(tmp_path, capsys):
    """Out-of-range ids and float records read from ArrayRecord files: the errors of
    write_rox, grain-rox convert and pack_documents name the file and the record, not
    only the item's position in the stream."""
    a = write_records(tmp_path / "a.array_record", [np.array([1, 2], np.uint64)])
    b = write_records(
        tmp_path / "b.array_record", [np.array([3], np.uint64), np.array([5, 2**40], np.uint64)]
    )
    src = ArrayRecordSource([a, b], dtype=np.uint64)
    assert src.describe_item(2) == f"{b}: record 1"
    for items in (src, src.iter_arrays()):
        with pytest.raises(ValueError) as info:
            write_rox(items, str(tmp_path / "o.rox"), dtype="uint16")
        assert str(info.value).startswith(
            f"item 2 ({b}: record 1) holds values in [5, 1099511627776] that do not fit uint16"
        )
    with pytest.raises(ValueError) as info:
        next(iter(pack_documents(src, seq_len=8, batch_size=1, shuffle=False)))
    assert str(info.value).startswith(
        f"pack_documents: document 2 ({b}: record 1) holds the id 1099511627776 in its tokens"
    )
    f = write_records(tmp_path / "f.array_record", [np.array([1.5, 2], np.float32)])
    floats = ArrayRecordSource(f, dtype=np.float32)
    with pytest.raises(TypeError) as info:
        write_rox(floats.iter_arrays(), str(tmp_path / "f.rox"), dtype="uint16")
    assert str(info.value).startswith(f"item 0 ({f}: record 0) has dtype float32, which cannot")
    with pytest.raises(ValueError) as info:
        next(iter(pack_documents(floats, seq_len=8, batch_size=1, shuffle=False)))
    assert str(info.value).startswith(
        f"pack_documents: document 0 ({f}: record 0): a document must be a 1-D integer token "
        "array, got float32"
    )
    n = write_records(tmp_path / "n.array_record", [np.array([4], np.int64), np.array([5, -3])])
    with pytest.raises(ValueError) as info:  # was packed as is: inputs [5], targets [-3]
        next(iter(pack_documents(ArrayRecordSource(n, dtype=np.int64), seq_len=8, batch_size=1)))
    assert str(info.value).startswith(
        f"pack_documents: document 1 ({n}: record 1) holds the id -3 in its tokens; token ids "
        "are >= 0"
    )
    long = write_records(tmp_path / "l.array_record", [np.arange(3), np.arange(1, 30)])
    with pytest.raises(ValueError) as info:  # long_documents="error" names it too
        next(iter(pack_documents(ArrayRecordSource(long, dtype=np.int64), seq_len=8,
                                 batch_size=2, shuffle=False, long_documents="error")))  # fmt: skip
    assert str(info.value).startswith(
        f"pack_documents: document 1 ({long}: record 1) has 29 tokens, more than the 9 a row"
    )
    code = main(["convert", a, b, "-o", str(tmp_path / "c.rox"), "--record-dtype", "uint64",
                 "--no-progress"])  # fmt: skip
    assert code == 2
    assert f"item 2 ({b}: record 1) holds token id 1099511627776, outside the bytes" in (
        capsys.readouterr().err
    )
    assert not os.path.exists(tmp_path / "c.rox") and not os.path.exists(tmp_path / "o.rox")


def test_an_exports_checksum_tells_document_boundaries_apart(tmp_path):
    """The sha256 an export reports (and checks its read-back against) hashed the records'
    bytes end to end: [1, 2], [3] and [1], [2, 3] had one checksum."""
    results = []
    for name, docs in (("a", [[1, 2], [3]]), ("b", [[1], [2, 3]])):
        path = str(tmp_path / f"{name}.rox")
        write_rox([np.array(d, np.uint16) for d in docs], path, separator=0)
        results.append(export_array_record(path, str(tmp_path / f"{name}.array_record")))
    assert [r.num_documents for r in results] == [2, 2]
    assert results[0].sha256 != results[1].sha256
    expected = hashlib.sha256()
    for record in (np.array([1, 2], np.uint16).tobytes(), np.array([3], np.uint16).tobytes()):
        expected.update(len(record).to_bytes(8, "little") + record)
    assert results[0].sha256 == expected.hexdigest()
