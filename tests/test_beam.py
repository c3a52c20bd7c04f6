"""Converting on Apache Beam (grain_rox.beam): the shards equal the local converter's byte for
byte on the DirectRunner with two worker processes, for the embedded corpus and for JSONL,
Parquet, saved HF datasets, text and ArrayRecord inputs; a bundle that fails on its first
attempt is retried without duplicates or holes; a pipeline that fails mid-way, or a commit
interrupted between its renames, leaves nothing half-visible. Skipped without the [beam] extra.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam")

from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner  # noqa: E402

from grain_rox import RoxFormatError, builtin_documents, open_rox, write_rox  # noqa: E402
from grain_rox.beam import ReadDocuments, WriteRox, run_convert  # noqa: E402
from grain_rox.cli import main  # noqa: E402

TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
SHARDING = {"block_size": 1024, "max_shard_bytes": 24 << 10}


def shard_files(directory) -> dict[str, bytes]:
    """Every visible shard file of a directory, by name (hidden temporaries are not)."""
    return {
        n: open(os.path.join(directory, n), "rb").read()
        for n in sorted(os.listdir(directory))
        if n.endswith(".rox") and not n.startswith(".")
    }


def hidden(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def manifest_facts(path: str) -> dict:
    """A manifest less what differs between two runs of any writer (write id, mtimes, and the
    checksum that seals them)."""
    data = json.loads(open(path).read())
    data.pop("write_id")
    assert data.pop("checksum").startswith("sha256:")
    for rec in data["shards"].values():
        rec.pop("mtime_ns")
    return data


def assert_same_set(ours: str, local: str, manifest: str) -> None:
    assert shard_files(ours) == shard_files(local)
    assert len(shard_files(ours)) >= 2
    assert manifest_facts(os.path.join(ours, manifest)) == manifest_facts(
        os.path.join(local, manifest)
    )
    assert hidden(ours) == []  # no temporaries left, no lock file
    assert main(["verify", ours]) == 0


@pytest.mark.slow  # two Beam worker processes: ~15 s here
def test_the_embedded_corpus_on_two_worker_processes_equals_the_local_converter(tmp_path, capsys):
    pytest.importorskip("tiktoken")
    docs = list(builtin_documents("prose", limit=60))
    write_rox(docs, tmp_path / "local" / "p.rox", tokenizer="cl100k_base", **SHARDING)
    summary = run_convert(
        None,
        tmp_path / "beam" / "p.rox",
        builtin="prose",
        limit=60,
        tokenizer="cl100k_base",
        beam_args=TWO_PROCESSES,
        **SHARDING,
    )
    assert_same_set(str(tmp_path / "beam"), str(tmp_path / "local"), "p.manifest.json")
    with open_rox(str(tmp_path / "local" / "p.rox")) as corpus:
        tokens = corpus.num_tokens - sum(s.num_padding_tokens or 0 for s in corpus.shards)
    assert summary.num_documents == 60 and summary.num_tokens == tokens
    assert summary.counters == {
        "documents": 60,
        "tokens": tokens,
        "skipped_inputs": 0,
        "null_texts": 0,
        "shards": len(summary.paths),
    }


@pytest.fixture
def mixed_inputs(tmp_path):
    """A directory of every text format the converter reads, plus a binary file it skips."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    src = tmp_path / "src"
    src.mkdir()
    prose = list(builtin_documents("prose", limit=40))
    lines = [json.dumps({"text": t}) for t in prose[:10]] + [json.dumps({"text": None})]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"text": prose[10:20]}), src / "b.parquet")
    datasets.Dataset.from_dict({"text": prose[20:30]}).save_to_disk(str(src / "c_saved"))
    (src / "d.txt").write_text(prose[30])
    (src / "e.bin").write_bytes(b"\x00\x01\x02binary")
    (src / "f.txt").write_text("".join(prose[31:40]))
    # A saved dataset is one input of its own (a directory input is walked file by file).
    names = ["a.jsonl", "b.parquet", "c_saved", "d.txt", "e.bin", "f.txt"]
    return [str(src / n) for n in names]


@pytest.mark.slow  # two Beam worker processes: ~15 s here
def test_jsonl_parquet_hf_and_text_inputs_on_two_workers_equal_the_local_converter(
    tmp_path, mixed_inputs, capsys
):
    local = str(tmp_path / "local" / "t.rox")
    os.makedirs(os.path.dirname(local))
    args = ["--on-null", "skip", "--block-size", "1024", "--max-shard-bytes", "24KiB"]
    assert main(["convert", *mixed_inputs, "-o", local, "--no-progress", *args]) == 0
    summary = run_convert(
        mixed_inputs,
        tmp_path / "beam" / "t.rox",
        on_null="skip",
        beam_args=TWO_PROCESSES,
        **SHARDING,
    )
    assert_same_set(str(tmp_path / "beam"), str(tmp_path / "local"), "t.manifest.json")
    assert summary.num_documents == 32  # 10 JSONL (1 null skipped), 10 + 10 rows, 2 files
    assert (summary.counters["skipped_inputs"], summary.counters["null_texts"]) == (1, 1)
    assert summary.skipped() == "skipped 1 input file and 1 null text"


def test_a_bundle_that_fails_on_its_first_attempt_is_retried_without_duplicates_or_holes(
    tmp_path, monkeypatch
):
    """The BundleBasedDirectRunner retries a failed bundle (the multi-process runner fails the
    pipeline instead). Each shard's first attempt writes and fsyncs its whole file, then dies
    as a killed worker would: its temporary stays behind."""
    from grain_rox._text import _shard_files

    finish = _shard_files.ShardFile.finish
    temporaries: list[str] = []
    failed: list[str] = []

    def finish_then_die_once(self):
        out = finish(self)
        temporaries.append(self.tmp_path)
        if not failed and len(temporaries) == expected:  # the last shard of the first pass
            failed.append(self.final_path)
            raise RuntimeError(f"injected: the worker writing {self.final_path} died")
        return out

    def killed(self):  # a killed worker deletes nothing
        pass

    docs = [((i % 3, i // 3), d) for i, d in enumerate(builtin_documents("prose", limit=30))]
    in_order = [d for _, d in sorted(docs)]
    write_rox(in_order, tmp_path / "local" / "r.rox", tokenizer="bytes", **SHARDING)
    expected = len(shard_files(tmp_path / "local"))
    monkeypatch.setattr(_shard_files.ShardFile, "finish", finish_then_die_once)
    monkeypatch.setattr(_shard_files.ShardFile, "discard", killed)
    out = tmp_path / "beam" / "r.rox"
    with beam.Pipeline(runner=BundleBasedDirectRunner()) as p:
        _ = p | beam.Create(docs) | WriteRox(out, tokenizer="bytes", **SHARDING)
    assert len(failed) == 1 and expected >= 2
    assert len(temporaries) > expected  # the failed bundle's shards were written twice
    assert not any(os.path.exists(t) for t in temporaries)  # renamed, or removed by the commit
    assert_same_set(str(tmp_path / "beam"), str(tmp_path / "local"), "r.manifest.json")


def test_a_pipeline_that_fails_mid_way_leaves_the_previous_set_and_nothing_half_visible(
    tmp_path, monkeypatch
):
    from grain_rox._text import _shard_files

    out = tmp_path / "set" / "m.rox"
    old = write_rox(["old data"] * 50, out, tokenizer="bytes", **SHARDING)
    before = shard_files(tmp_path / "set")
    finish = _shard_files.ShardFile.finish

    def fail_one(self):
        if self.final_path.endswith("_0002.rox"):
            raise RuntimeError("injected: the disk filled up")
        return finish(self)

    monkeypatch.setattr(_shard_files.ShardFile, "finish", fail_one)
    docs = [((0, i), d) for i, d in enumerate(builtin_documents("prose", limit=30))]
    failing = pytest.raises(Exception, match="injected: the disk filled up")
    with failing, beam.Pipeline(runner=BundleBasedDirectRunner()) as p:
        _ = p | beam.Create(docs) | WriteRox(out, if_exists="overwrite", **SHARDING)
    # The other shards were written, under hidden names only; the old set is whole and opens.
    assert shard_files(tmp_path / "set") == before
    assert any(n.endswith(".tmp") for n in hidden(tmp_path / "set"))
    with open_rox(str(out)) as corpus:
        assert corpus.num_documents == 50 and len(corpus.shards) == len(old.paths)
    assert main(["verify", str(tmp_path / "set")]) == 0
    # Run again without the fault: the new set replaces the old one, and the temporaries go.
    monkeypatch.setattr(_shard_files.ShardFile, "finish", finish)
    with beam.Pipeline() as p:
        _ = p | beam.Create(docs) | WriteRox(out, if_exists="overwrite", **SHARDING)
    write_rox([d for _, d in docs], tmp_path / "local" / "m.rox", **SHARDING, tokenizer="bytes")
    assert_same_set(str(tmp_path / "set"), str(tmp_path / "local"), "m.manifest.json")


def test_a_bad_input_fails_the_pipeline_naming_it_and_publishes_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("fine")
    (src / "b.txt").write_bytes(b"caf\xe9 is not UTF-8")
    with pytest.raises(ValueError, match=r"the Beam pipeline failed: .*b\.txt.*UTF-8"):
        run_convert(src, tmp_path / "out" / "x.rox")
    assert os.listdir(tmp_path / "out") == []


def test_a_commit_interrupted_between_its_renames_is_refused_then_finished_by_a_retry(
    tmp_path, monkeypatch
):
    """The commit step itself killed after its first rename: the set refuses to open (a mix
    of the old and the new data); the same commit run again (a retried step) finishes it."""
    from grain_rox._beam._commit import commit_shards, conversion_layout
    from grain_rox._beam._plan import ShardPlan
    from grain_rox._beam._write_shard import write_shard
    from grain_rox._format import _shard_set

    out = str(tmp_path / "set" / "c.rox")
    write_rox(["old"] * 40, out, tokenizer="bytes", block_size=64, max_shard_bytes=200)
    layout = conversion_layout("bytes", block_size=64)
    tokens = np.arange(100, dtype=layout.dtype)
    plan = ShardPlan.from_parts([(0, 100, 1)], tokens_per_block=32, blocks_per_shard=1)
    pieces = [[(0, tokens[s * 32 : s * 32 + 32].tobytes(), int(s == 0))] for s in range(4)]
    written = [write_shard(out, 200, s, pieces[s], plan, layout) for s in range(4)]
    replace, renamed = os.replace, []

    def die_after_one(src, dst):
        if not dst.endswith(".rox"):  # the manifest's own renames
            return replace(src, dst)
        if renamed:
            raise KeyboardInterrupt("injected: killed mid-commit")
        renamed.append(dst)
        replace(src, dst)

    monkeypatch.setattr(_shard_set.os, "replace", die_after_one)
    with pytest.raises(KeyboardInterrupt):
        commit_shards(
            out, 200, written, plan, layout, run_id="feedfacefeedface", if_exists="overwrite"
        )
    with pytest.raises(RoxFormatError, match="interrupted while it published"):
        open_rox(out)
    monkeypatch.setattr(_shard_set.os, "replace", replace)
    commit_shards(out, 200, written, plan, layout, run_id="feedfacefeedface", if_exists="overwrite")
    with open_rox(out) as corpus:
        assert corpus.tokens(0, 100).tolist() == tokens.tolist()
        assert corpus.num_documents == 1 and len(corpus.shards) == 4
    assert hidden(tmp_path / "set") == []
    # Run once more (a second retry): nothing changes.
    again = commit_shards(out, 200, written, plan, layout, run_id="feedfacefeedface")
    assert again.write_id == "feedfacefeedface"


def test_a_hole_or_conflicting_duplicate_publishes_nothing(tmp_path):
    from grain_rox._beam._commit import commit_shards, conversion_layout
    from grain_rox._beam._plan import ShardPlan
    from grain_rox._beam._write_shard import write_shard

    out = str(tmp_path / "h.rox")
    layout = conversion_layout("bytes", block_size=64)
    plan = ShardPlan.from_parts([(0, 64, 2)], tokens_per_block=32, blocks_per_shard=1)
    data = np.arange(64, dtype=layout.dtype).tobytes()
    first = write_shard(out, 200, 0, [(0, data[:64], 1)], plan, layout)
    with pytest.raises(RoxFormatError, match=r"planned 2 shard\(s\) but the workers reported 1 "):
        commit_shards(out, 200, [first], plan, layout, run_id="00")
    other = write_shard(out, 200, 0, [(0, data[64:], 1)], plan, layout)
    with pytest.raises(RoxFormatError, match="two attempts wrote shard 0 with different bytes"):
        commit_shards(out, 200, [first, other], plan, layout, run_id="00")
    with pytest.raises(RoxFormatError, match="shard 1 has a gap at token 0"):
        write_shard(out, 200, 1, [(5, data[64:], 0)], plan, layout)
    assert shard_files(tmp_path) == {} and not os.path.exists(tmp_path / "h.manifest.json")


def test_two_documents_with_one_key_are_an_error_naming_the_key(tmp_path):
    docs = [((0, 0), "a"), ((0, 1), "b"), ((0, 1), "c")]
    failing = pytest.raises(Exception, match=r"two documents have the key \(0, 1\)")
    with failing, beam.Pipeline() as p:
        _ = p | beam.Create(docs) | WriteRox(tmp_path / "k.rox")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("if_exists", ["error", "overwrite"])
def test_one_member_written_beside_a_set_joins_it_as_the_local_writer_does(tmp_path, if_exists):
    """Writing x_0009.rox (no max_shard_bytes) beside a set x_0000..: the local writer adds
    it and keeps the others; Beam's commit listed only its own shard and deleted the rest."""
    docs = ["a" * 3000] * 4
    for kind in ("local", "beam"):
        out = tmp_path / kind
        write_rox(docs, out / "x.rox", tokenizer="bytes", max_shard_bytes=8 << 10)
        member = str(out / ("x_0009.rox" if if_exists == "error" else "x_0001.rox"))
        new = ["new member doc 1", "new member doc 2"]
        if kind == "local":
            write_rox(new, member, tokenizer="bytes", if_exists=if_exists)
        else:
            with beam.Pipeline() as p:
                keyed = [((0, i), t) for i, t in enumerate(new)]
                _ = p | beam.Create(keyed) | WriteRox(member, tokenizer="bytes",
                                                      if_exists=if_exists)  # fmt: skip
    assert shard_files(tmp_path / "beam") == shard_files(tmp_path / "local")
    assert len(shard_files(tmp_path / "beam")) == (7 if if_exists == "error" else 6)
    assert manifest_facts(str(tmp_path / "beam" / "x.manifest.json")) == manifest_facts(
        str(tmp_path / "local" / "x.manifest.json")
    )
    assert main(["verify", str(tmp_path / "beam")]) == 0


def test_a_member_of_another_block_size_is_refused_as_the_local_writer_refuses_it(tmp_path):
    """Beam's commit of one member beside a set did not check the block size: a set of 4096-
    byte blocks took a member of 8192, which roxxel misreads (its failure W6)."""
    write_rox(["a" * 3000] * 4, tmp_path / "x.rox", tokenizer="bytes", max_shard_bytes=8 << 10)
    before = shard_files(tmp_path)
    failing = pytest.raises(Exception, match=re.escape(
        "cannot write block_size=8192 into the set of "
        f"{tmp_path / 'x_0000.rox'}, whose blocks are 4096 bytes"
    ))  # fmt: skip
    with failing, beam.Pipeline() as p:
        keyed = [((0, 0), "new member doc")]
        _ = (
            p
            | beam.Create(keyed)
            | WriteRox(str(tmp_path / "x_0009.rox"), tokenizer="bytes", block_size=8192)
        )
    assert shard_files(tmp_path) == before


def test_convert_options_mistyped_for_beam_are_refused_not_dropped(tmp_path, capsys):
    """Beam drops the options it does not know with a log line: a mistyped grain-rox option
    (or one spelled Beam's way) ran on without it, exit 0; --record-dtype on text was ignored
    on Beam only."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some text to tokenize\n")
    convert = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "o.rox"), "--no-progress"]
    beam_run = ["--runner", "DirectRunner"]
    with pytest.raises(SystemExit) as exited:
        main([*convert, *beam_run, "--tokeniser=cl100k_base", "--max_shard_bytes=4KiB"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "grain-rox: error: unrecognized arguments: --tokeniser=cl100k_base (did you mean "
        "--tokenizer?), --max_shard_bytes=4KiB (did you mean --max-shard-bytes?); grain-rox "
        "convert's options are spelled with dashes, Beam's with underscores"
    )
    assert main([*convert, *beam_run, "--record-dtype", "uint16"]) == 2
    assert "--record-dtype uint16 applies to ArrayRecord token documents only" in (
        capsys.readouterr().err
    )
    assert not os.path.exists(tmp_path / "o.rox")
    assert main([*convert, *beam_run, "--direct_num_workers=1", "--job_name=ok"]) == 0


def test_options_are_checked_when_the_transforms_are_made(tmp_path):
    write_rox(["x"], tmp_path / "e.rox")
    with pytest.raises(FileExistsError, match=r"e\.rox exists") as exists:
        WriteRox(tmp_path / "e.rox")
    assert "pass --if-exists overwrite (if_exists='overwrite') to replace it" in str(exists.value)
    assert "append" not in str(exists.value).split("(appending")[0]
    with pytest.raises(ValueError, match=r"appending to .* is not supported on Beam"):
        WriteRox(tmp_path / "e.rox", if_exists="append")
    with pytest.raises(TypeError, match="give the tokenizer's name"):
        WriteRox(tmp_path / "n.rox", tokenizer=object())  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ReadDocuments(tmp_path / "missing")
    with pytest.raises(ValueError, match="limit= selects the first documents of the embedded"):
        ReadDocuments(tmp_path, limit=3)


def test_a_beam_conversion_to_a_bucket_url_is_refused_naming_the_fix(tmp_path):
    from grain_rox.beam import run_convert

    with pytest.raises(ValueError, match=r"not to gs://b/p\.rox: its commit renames files"):
        run_convert(None, "gs://b/p.rox", builtin="prose", limit=3)


def test_token_arrays_holding_the_eos_count_their_documents_as_the_local_writer(tmp_path):
    """A token-array document holding the EOS id is two documents to readers: the Beam
    manifest counts them per shard where they start, as write_rox does (it counted items)."""
    docs = [np.array([104, 256, 105, 256, 107], np.int64), np.array([106], np.int64)]
    kw = {"tokenizer": "bytes", "block_size": 8, "max_shard_bytes": 64}
    with beam.Pipeline() as p:
        keyed = p | beam.Create([((0, i), a) for i, a in enumerate(docs)])
        _ = keyed | WriteRox(str(tmp_path / "beam" / "b.rox"), **kw)
    write_rox(docs, str(tmp_path / "local" / "b.rox"), **kw)
    assert shard_files(tmp_path / "beam") == shard_files(tmp_path / "local")
    records = [
        json.loads((tmp_path / d / "b.manifest.json").read_text())["shards"]
        for d in ("beam", "local")
    ]
    counts = [{n: r["num_documents"] for n, r in rec.items()} for rec in records]
    assert counts[0] == counts[1] and sum(counts[0].values()) == 4
    assert open_rox(str(tmp_path / "beam" / "b.rox")).num_documents == 4


def test_a_beam_conversion_never_reads_its_own_output_set(tmp_path, caplog):
    """As grain-rox convert: an output inside an input directory is left out of the inputs
    when run again (the old shard and manifest were read back as documents), and said."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha")
    (corpus / "b.txt").write_text("beta")
    out = corpus / "train.rox"
    run_convert(corpus, out)
    with caplog.at_level("WARNING", logger="grain_rox"):
        run_convert(corpus, out, if_exists="overwrite")
    said = [r.getMessage() for r in caplog.records if "output set's own" in r.getMessage()]
    assert said and "train.manifest.json" in said[0] and "train.rox" in said[0]
    with open_rox(str(out)) as written:
        assert written.num_documents == 2
        assert written.tokens(0, 11).tolist() == [*b"alpha", 256, *b"beta", 256]


def test_a_conversion_run_again_after_a_commit_killed_mid_rename_rolls_it_back(
    tmp_path, monkeypatch
):
    """A first conversion into a new set killed between its shard renames leaves a set that
    refuses to open saying "running the write again works": write_rox does roll the killed
    write back and writes; WriteRox refused at once, as if a set of 1 shard existed."""
    from grain_rox._beam._commit import commit_shards, conversion_layout
    from grain_rox._beam._plan import ShardPlan
    from grain_rox._beam._write_shard import write_shard
    from grain_rox._format import _shard_set

    out = str(tmp_path / "set" / "c.rox")
    os.makedirs(os.path.dirname(out))
    layout = conversion_layout("bytes", block_size=64)
    tokens = np.arange(100, dtype=layout.dtype)
    plan = ShardPlan.from_parts([(0, 100, 1)], tokens_per_block=32, blocks_per_shard=1)
    pieces = [[(0, tokens[s * 32 : s * 32 + 32].tobytes(), int(s == 0))] for s in range(4)]
    written = [write_shard(out, 200, s, pieces[s], plan, layout) for s in range(4)]
    replace = os.replace

    def die_after_one(src, dst):
        if dst.endswith("_0001.rox"):
            raise KeyboardInterrupt("injected: killed mid-commit")
        replace(src, dst)

    monkeypatch.setattr(_shard_set.os, "replace", die_after_one)
    with pytest.raises(KeyboardInterrupt):
        commit_shards(out, 200, written, plan, layout, run_id="feedfacefeedface")
    monkeypatch.setattr(_shard_set.os, "replace", replace)
    with pytest.raises(RoxFormatError, match="running the write again works"):
        open_rox(out)
    docs = [((0, i), t) for i, t in enumerate(["first", "second"])]
    with beam.Pipeline() as p:
        _ = p | beam.Create(docs) | WriteRox(out, block_size=64, max_shard_bytes=200)
    with open_rox(out) as corpus:
        assert corpus.num_documents == 2 and len(corpus.shards) == 1
        assert corpus.tokens(0, 13).tolist() == [*b"first", 256, *b"second", 256]
    assert hidden(tmp_path / "set") == []


def test_a_commit_that_fails_before_its_renames_is_retried_by_the_runner_and_publishes(
    tmp_path, monkeypatch
):
    """The commit's first manifest write fails once (a transient I/O error): the runner
    retries the step, which publishes. The failed attempt deleted every shard it was to
    publish, so each retry failed ('shard 0 was written under ..., which is gone') and the
    whole conversion had to be run again."""
    import errno

    from grain_rox._format import _shard_set

    write_manifest, calls = _shard_set.write_manifest, []

    def fails_once(path, manifest):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected: a transient I/O error", path)
        return write_manifest(path, manifest)

    monkeypatch.setattr(_shard_set, "write_manifest", fails_once)
    docs = [((0, i), d) for i, d in enumerate(builtin_documents("prose", limit=20))]
    with beam.Pipeline(runner=BundleBasedDirectRunner()) as p:
        _ = p | beam.Create(docs) | WriteRox(tmp_path / "beam" / "f.rox", **SHARDING)
    assert len(calls) == 3  # the failed attempt's, then the retry's pending and final
    write_rox([d for _, d in docs], tmp_path / "local" / "f.rox", tokenizer="bytes", **SHARDING)
    assert_same_set(str(tmp_path / "beam"), str(tmp_path / "local"), "f.manifest.json")
