"""Shards in a bucket: real GCS (fake-gcs-server) and S3 (moto) servers on loopback, reached
through gcsfs and s3fs, against the same shards read from local disk.

Reads are byte-exact and give the same batches as local files; a write killed mid-upload is
refused, never half-read, and a rerun finishes it; a server stopped and restarted is retried
through; objects rewritten after a checkpoint refuse its restore.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import select
import signal
import threading
import time

import numpy as np
import pytest

import grain_rox
from grain_rox import (
    MultiHostDataLoadIterator,
    RoxFormatError,
    TokenPipeline,
    object_store_stats,
    open_rox,
    write_rox,
)
from grain_rox.cli import main

DOCS = list(grain_rox.builtin_documents("prose"))[:400]


@pytest.fixture(params=["gcs", "s3"])
def bucket(request):
    """A fresh bucket URL on each server, with the server (for its options and restarts)."""
    name = request.param
    server = request.getfixturevalue(f"{name}_server")
    url = request.getfixturevalue(f"{name}_bucket")
    return url, server


@pytest.fixture(scope="module")
def local_set(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("local") / "prose.rox")
    write_rox(DOCS, path, tokenizer="bytes", block_size=4096, max_shard_bytes=200_000)
    return path


def upload(url_set: str, server, docs=DOCS, **kwargs):
    return write_rox(
        docs,
        url_set,
        tokenizer="bytes",
        block_size=4096,
        max_shard_bytes=200_000,
        storage_options=server.storage_options,
        **kwargs,
    )


def test_a_set_in_a_bucket_reads_byte_for_byte_as_on_disk(bucket, local_set):
    url, server = bucket
    result = upload(f"{url}/data/prose.rox", server)
    assert result.manifest_path == f"{url}/data/prose.manifest.json"
    local = open_rox(local_set)
    opts = server.storage_options
    for spec in [f"{url}/data/prose.rox", f"{url}/data/", f"{url}/data/prose_*.rox"]:
        remote = open_rox(spec, storage_options=opts, verify=True)
        assert [p.rsplit("/", 1)[1] for p in remote.paths] == [
            p.rsplit("/", 1)[1] for p in local.paths
        ]
        assert remote.num_tokens == local.num_tokens and remote.eos_id == local.eos_id == 256
        assert remote.num_documents == local.num_documents == len(DOCS)
        np.testing.assert_array_equal(
            remote.tokens(0, remote.num_tokens), local.tokens(0, local.num_tokens)
        )
        for i in [0, 7, len(local) - 1]:
            np.testing.assert_array_equal(remote[i], local[i])
        starts = np.array([5, 0, 1000, 40_000])
        np.testing.assert_array_equal(remote.gather(1, starts, 33), local.gather(1, starts, 33))
    # The same objects give the same fingerprint in every open.
    again = open_rox(f"{url}/data/prose.rox", storage_options=opts)
    assert again.fingerprint == remote.fingerprint
    assert repr(again) == repr(remote)


@pytest.mark.parametrize("kwargs", [{}, {"packing": "best_fit"}, {"order": "lanes"}])
def test_pipelines_over_a_bucket_give_the_batches_of_local_files(bucket, local_set, kwargs):
    url, server = bucket
    upload(f"{url}/p/prose.rox", server)
    remote_spec = f"{url}/p/prose.rox"
    local = TokenPipeline(local_set, seq_len=128, global_batch_size=8, **kwargs)
    with server.environment():  # the pipeline reaches the bucket through fsspec's config
        remote = TokenPipeline(remote_spec, seq_len=128, global_batch_size=8, **kwargs)
        a, b = local.map_dataset(), remote.map_dataset()
        for k in [0, 1, 57, 10**6]:
            x, y = a[k], b[k]
            assert x.keys() == y.keys()
            for key in x:
                np.testing.assert_array_equal(x[key], y[key], err_msg=f"{kwargs} {k} {key}")


def test_a_checkpoint_restores_over_a_bucket_and_is_refused_after_a_rewrite(bucket):
    url, server = bucket
    spec = f"{url}/ck/prose.rox"
    upload(spec, server)
    with server.environment():
        it = MultiHostDataLoadIterator(TokenPipeline(spec, seq_len=64, global_batch_size=8))
        for _ in range(3):
            next(it)
        state = it.get_state()
        expected = [next(it) for _ in range(3)]
        again = MultiHostDataLoadIterator(TokenPipeline(spec, seq_len=64, global_batch_size=8))
        again.set_state(state)
        for want in expected:
            got = next(again)
            for key in want:
                np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))
        # The same documents in another order: the same sizes, other bytes.
        upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
        rewritten = MultiHostDataLoadIterator(TokenPipeline(spec, seq_len=64, global_batch_size=8))
        with pytest.raises(ValueError, match=r"the pipeline changed \(data: saved"):
            rewritten.set_state(state)


def test_an_object_rewritten_after_open_is_refused_not_mixed(bucket):
    url, server = bucket
    spec = f"{url}/rw/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    copy = pickle.loads(pickle.dumps(corpus))  # as a Grain worker receives it
    upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
    with pytest.raises(RoxFormatError, match="rewritten after the corpus was opened"):
        copy.tokens(0, 10)


def test_an_object_removed_after_open_is_refused_naming_it(bucket):
    """A removal gave a bare FileNotFoundError with the store's inner path, no fix."""
    url, server = bucket
    spec = f"{url}/rm/prose.rox"
    written = upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    batches = TokenPipeline(corpus, seq_len=128, global_batch_size=8).map_dataset()
    server.filesystem().rm_file(written.paths[0].split("://", 1)[1])
    removed = re.escape(f"{written.paths[0]}: the object was removed after the corpus was opened")
    for read in (lambda: corpus.tokens(0, 10), lambda: batches[0]):
        with pytest.raises(RoxFormatError, match=f"^{removed}. Fix: restore it, or reopen"):
            read()


def test_a_shard_rewritten_after_a_process_read_it_is_refused_at_its_next_read(bucket):
    url, server = bucket
    spec = f"{url}/mid/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    before = corpus.tokens(0, 50).copy()  # shard 0 mapped: its version checked once, here
    assert bytes(before.astype(np.uint8)) == DOCS[0].encode()[:50]
    upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")  # same sizes, other bytes
    # Every read is pinned to the version opened: bytes of the new write never come back.
    with pytest.raises(RoxFormatError, match="rewritten or removed after the corpus was opened"):
        corpus.tokens(60_000, 60_050)  # not cached: fetched from the object, refused
    np.testing.assert_array_equal(corpus.tokens(0, 50), before)  # cached: still the old bytes


def test_a_corpus_read_in_a_forked_child_makes_its_own_connection(bucket, local_set):
    """A ``fork()``ed child (multiprocessing's default on Linux: ``Pool``, other loaders'
    workers) reused the parent's fsspec filesystem, which refuses ("This class is not
    fork-safe"): six retries, then an error blaming the network."""
    import os

    url, server = bucket
    spec = f"{url}/fork/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    corpus.tokens(0, 10)  # the parent's filesystem made and used
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one read of blocks the parent never fetched
        try:
            os.environ["GRAIN_ROX_OBJECT_ATTEMPTS"] = "1"
            out = corpus.tokens(150_000, 150_005).tolist()
        except BaseException as e:
            out = f"{type(e).__name__}: {e}"
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 120)  # a child stuck on a lock: fail, not hang
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        got = json.loads(pipe.read() or '"no answer in 120 s"')
    assert got == open_rox(local_set).tokens(150_000, 150_005).tolist()


def test_reads_at_a_shards_edges_are_those_of_a_local_shard(bucket, local_set):
    """A window past a bucket shard's tokens came back holding its block index as tokens, and
    a negative start or bound was read from token 0: reads at the edges now match the local
    shard's (numpy's rules: an IndexError past the end, negatives counted from it)."""
    url, server = bucket
    spec = f"{url}/edges/prose.rox"
    upload(spec, server)
    remote = open_rox(spec, storage_options=server.storage_options)
    local = open_rox(local_set)
    n = local.shards[0].num_tokens
    for read in (
        lambda c: c.gather(0, np.array([-1, 5, -n + 7]), 4),
        lambda c: c.shard_slice(0, -4, n),
        lambda c: c.shard_slice(0, -n - 9, 3),
    ):
        np.testing.assert_array_equal(read(remote), read(local))
    for corpus in (remote, local):
        with pytest.raises(IndexError):
            corpus.gather(0, np.array([n - 3]), 8)


def test_hidden_objects_stay_out_of_memory_urls_too(tmp_path):
    """fsspec's memory:// lists "/bucket/path" (a leading slash): the hidden-name rule compared
    path parts one off and read ._prose.rox and .old/y.rox as shards there."""
    root = f"memory://hidden-{os.getpid()}-{tmp_path.name}"
    for base in (str(tmp_path), root):
        for name, docs in (("prose", DOCS[:3]), ("._prose", DOCS[3:4]), (".old/y", DOCS[4:5])):
            write_rox(docs, f"{base}/t/{name}.rox", tokenizer="bytes")
    for pattern in ("t/*.rox", "t/*", "t/"):
        local = open_rox(f"{tmp_path}/{pattern}")
        remote = open_rox(f"{root}/{pattern}")
        assert [p.split("/t/", 1)[1] for p in remote.paths] == ["prose.rox"], pattern
        assert [p.split("/t/", 1)[1] for p in local.paths] == ["prose.rox"], pattern


def test_a_glob_names_the_same_shards_in_a_bucket_as_on_disk(bucket, tmp_path):
    """``**`` is not recursive in a local path's glob (Python's, as roxxel's): fsspec's was,
    and read every set below the prefix as one corpus. A local ``*`` matched the manifest.
    Hidden names (``._prose.rox`` from a macOS copy, ``.old/``) were read from a bucket as
    shards of the corpus, which a local glob or directory leaves out. A prefix that a glob
    matches (``t/*`` matching ``t/sub``) gives its shards as a matched local directory does;
    a bucket left them out, and served fewer documents than the same files on disk."""
    url, server = bucket
    for root, options in ((str(tmp_path), None), (url, server.storage_options)):
        for name, docs in (("prose", DOCS[:20]), ("sub/other", DOCS[20:30]),
                           ("sub/deeper/x", DOCS[30:35]), ("._prose", DOCS[35:37]),
                           (".old/y", DOCS[37:39])):  # fmt: skip
            write_rox(docs, f"{root}/t/{name}.rox", tokenizer="bytes", storage_options=options)
    for pattern in ("t/**/*.rox", "t/*/*.rox", "t/*.rox", "t/pro*", "t/", "t/.*.rox",
                    "t/.old/*.rox", "t/*prose.rox", "t/*", "t/s*"):  # fmt: skip
        local = open_rox(f"{tmp_path}/{pattern}")
        remote = open_rox(f"{url}/{pattern}", storage_options=server.storage_options)
        assert [p.split("/t/", 1)[1] for p in remote.paths] == [
            p.split("/t/", 1)[1] for p in local.paths
        ], pattern
        assert remote.num_tokens == local.num_tokens
    # A matched object that is no shard is refused, not passed over, on disk and in a bucket.
    (tmp_path / "t" / "notes.txt").write_text("x")
    server.filesystem().pipe_file(f"{url}/t/notes.txt".split("://", 1)[1], b"x")
    for root, options in ((str(tmp_path), None), (url, server.storage_options)):
        with pytest.raises(RoxFormatError, match=re.escape(f"{root}/t/notes.txt: the file is")):
            open_rox(f"{root}/t/*", storage_options=options)


def test_a_rewrite_between_open_and_the_first_read_is_refused_in_the_opening_process(bucket):
    url, server = bucket
    spec = f"{url}/st/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)  # fills fsspec's listing
    other = server.filesystem()  # another machine rewrites the first shard
    shard = corpus.paths[0]
    data = other.cat_file(shard)
    other.pipe_file(shard, data[::-1])
    with pytest.raises(RoxFormatError, match="rewritten"):
        corpus.tokens(0, 10)


def test_a_shard_object_replaced_after_the_write_is_refused_at_open(bucket):
    url, server = bucket
    spec = f"{url}/rp/prose.rox"
    result = upload(spec, server)
    other = server.filesystem()
    data = bytearray(other.cat_file(result.paths[0]))
    data[5000:5010] = b"XXXXXXXXXX"  # the same size, other tokens: only the content differs
    other.pipe_file(result.paths[0], bytes(data))
    with pytest.raises(RoxFormatError, match="was replaced after the set was written") as e:
        open_rox(spec, storage_options=server.storage_options)
    assert result.paths[0] in str(e.value) and "if_exists='overwrite'" in str(e.value)
    manifest = json.loads(other.cat_file(result.manifest_path))
    assert all(rec["object_tag"] for rec in manifest["shards"].values())


def test_a_set_copied_in_by_another_tool_says_that_only_verify_checks_its_bytes(
    bucket, local_set, caplog
):
    """A copy (gsutil cp, aws s3 sync) has no content hashes in its manifest: a shard changed
    after the copy was served without a word. Now said once, with the fix; verify refuses."""
    import logging
    import os

    url, server = bucket
    fs = server.filesystem()
    folder = os.path.dirname(local_set)
    names = sorted(n for n in os.listdir(folder) if n.startswith("prose"))
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            fs.pipe_file(f"{url}/cp/{name}".split("://", 1)[1], f.read())
    shard = f"{url}/cp/prose_0000.rox".split("://", 1)[1]
    data = bytearray(fs.cat_file(shard))
    data[5000:5010] = b"XXXXXXXXXX"  # changed after the copy, the same size
    fs.pipe_file(shard, bytes(data))
    spec = f"{url}/cp/prose.rox"
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        open_rox(spec, storage_options=server.storage_options)
        open_rox(spec, storage_options=server.storage_options)
    said = [m for m in caplog.messages if "records no content hashes" in m]
    assert said == [
        f"{url}/cp/prose.manifest.json records no content hashes for its objects (a set copied "
        "into the bucket by another tool, not published by write_rox): a shard changed since "
        "the copy is served until grain-rox verify checks every shard against the manifest's "
        "sha256; run it once, or publish the set with write_rox / grain-rox convert"
    ]
    with server.environment():
        assert main(["verify", spec]) == 1


def _another_writer_at_shard_1(monkeypatch, server, *, before=None, after=None) -> None:
    """Uploads of this process's writes, with another writer's ``before(fs, url)`` (or
    ``after``) acting on shard 1's object around this write's upload of it."""
    from grain_rox._format import _object_upload

    real_upload = _object_upload._upload
    other = server.filesystem()

    def racing(store, path, target, md5):
        if target.endswith("_0001.rox") and before:
            before(other, target)
        real_upload(store, path, target, md5)
        if target.endswith("_0001.rox") and after:
            after(other, target)

    monkeypatch.setattr(_object_upload, "_upload", racing)


def test_a_concurrent_writer_replacing_a_shard_mid_write_is_caught(bucket, monkeypatch):
    url, server = bucket
    spec = f"{url}/race/prose.rox"
    upload(spec, server)

    def replaced(fs, target):  # another writer's bytes (a valid shard) land there
        fs.rm_file(target)
        fs.pipe_file(target, fs.cat_file(target.replace("_0001", "_0000")))

    _another_writer_at_shard_1(monkeypatch, server, after=replaced)
    with pytest.raises(OSError, match="another writer replaced it during this write"):
        upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
    with pytest.raises(RoxFormatError, match="has not finished"):
        open_rox(spec, storage_options=server.storage_options)


def test_a_writer_that_finds_a_shard_name_taken_says_another_writer_did_it(bucket, monkeypatch):
    """Two writes of one set at once: the one whose create-only upload found another's bytes
    there raised the store's own text (a URL, or 'At least one of the pre-conditions you
    specified did not hold') and not that the set is now refused until a write finishes."""
    url, server = bucket
    spec = f"{url}/taken/prose.rox"
    upload(spec, server)
    # the other write's shard lands there first
    _another_writer_at_shard_1(
        monkeypatch, server, before=lambda fs, target: fs.pipe_file(target, b"other bytes")
    )
    with pytest.raises(FileExistsError, match=r"prose_0001\.rox: another writer uploaded the "
                       r"shard first \(the store refused to replace it\): two writes of the set "
                       r"ran at once, and it is refused until one finishes\. Fix: run one write "
                       r"of the set at a time, then run it again with if_exists='overwrite'"):  # fmt: skip
        upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
    # refused to read (the other writer's object is no shard; the manifest is pending)
    with pytest.raises(RoxFormatError, match=r"prose_0001\.rox: the file is only 11 bytes"):
        open_rox(spec, storage_options=server.storage_options)


def test_a_retried_upload_whose_first_attempt_landed_is_taken_as_done(bucket, monkeypatch):
    url, server = bucket
    spec = f"{url}/retry/prose.rox"
    monkeypatch.setenv("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.01")
    store = grain_rox._format._object_store.store_for(spec, server.storage_options)
    real_put = store.fs.put_file
    lost = []

    def answer_lost_once(*args, **kwargs):
        result = real_put(*args, **kwargs)
        if not lost:
            lost.append(args[1])
            raise ConnectionResetError("the object was stored, its answer lost")
        return result

    monkeypatch.setattr(store.fs, "put_file", answer_lost_once)
    upload(spec, server)
    assert lost  # the first upload was retried, and its name already held its bytes
    corpus = open_rox(spec, storage_options=server.storage_options, verify=True)
    assert corpus.num_documents == len(DOCS)


def test_a_versioned_s3_bucket_reads_in_a_fresh_process(s3_server, s3_bucket):
    import boto3
    import fsspec

    boto3.client(
        "s3", endpoint_url=s3_server.endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-west-2",
    ).put_bucket_versioning(
        Bucket=s3_bucket.split("://", 1)[1], VersioningConfiguration={"Status": "Enabled"}
    )  # fmt: skip
    spec = f"{s3_bucket}/v/prose.rox"
    upload(spec, s3_server)
    blob = pickle.dumps(open_rox(spec, storage_options=s3_server.storage_options))
    grain_rox._format._object_store._stores.clear()  # what a new process starts with
    fsspec.filesystem("s3").clear_instance_cache()
    corpus = pickle.loads(blob)
    assert corpus.tokens(0, 5).tolist() == list(DOCS[0].encode()[:5])


def test_a_missing_bucket_is_named(bucket):
    _, server = bucket
    missing = f"{server.protocol}://no-such-bucket-{id(server)}/prose.rox"
    with pytest.raises(FileNotFoundError, match="does not exist, or these credentials"):
        open_rox(missing, storage_options=server.storage_options)
    # a write to it is refused before any document is read (it failed at the first upload,
    # the corpus tokenized; on GCS naming only the upload's URL)
    read = []

    def docs():
        for doc in DOCS:
            read.append(doc)
            yield doc

    root = missing.rsplit("/", 1)[0]
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(missing)}: the bucket "
                       rf"{re.escape(root)} does not exist, or these credentials and endpoint "
                       "cannot see it. Fix: create the bucket"):  # fmt: skip
        upload(missing, server, docs=docs())
    assert read == []


def test_an_error_of_the_staged_write_names_the_url_not_the_staging_directory(bucket):
    url, server = bucket
    spec = f"{url}/staged/prose.rox"
    with pytest.raises(ValueError, match=rf"nothing to write to {re.escape(spec)}: ") as info:
        upload(spec, server, docs=[])
    assert "grain_rox_upload_" not in str(info.value)


def test_a_write_killed_mid_upload_is_refused_and_a_rerun_finishes_it(bucket, monkeypatch):
    url, server = bucket
    spec = f"{url}/kill/prose.rox"
    upload(spec, server)
    store = grain_rox._format._object_store.store_for(spec, server.storage_options)
    real_put = store.fs.put_file
    calls = []

    def dies_on_the_third(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-upload")
        return real_put(*args, **kwargs)

    monkeypatch.setattr(store.fs, "put_file", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
    monkeypatch.setattr(store.fs, "put_file", real_put)
    with pytest.raises(RoxFormatError, match="has not finished") as refused:
        open_rox(spec, storage_options=server.storage_options)
    assert "if_exists='overwrite'" in str(refused.value)
    upload(spec, server, docs=DOCS[::-1], if_exists="overwrite")
    corpus = open_rox(spec, storage_options=server.storage_options, verify=True)
    assert corpus.num_documents == len(DOCS)
    first = DOCS[-1].encode()  # the rewrite's first document
    assert corpus.tokens(0, len(first)).tolist() == list(first)


def test_an_existing_set_is_not_overwritten_by_default_nor_appended(bucket):
    url, server = bucket
    spec = f"{url}/ex/prose.rox"
    upload(spec, server)
    read = []

    def documents():
        for doc in DOCS:
            read.append(doc)
            yield doc

    with pytest.raises(FileExistsError, match="if_exists='overwrite'"):
        upload(spec, server, docs=documents())
    assert not read  # refused before a document was read or staged
    with pytest.raises(ValueError, match="append"):
        upload(spec, server, if_exists="append")


def test_a_denial_or_missing_credentials_fails_at_once_naming_the_url_and_the_fix(
    bucket, monkeypatch
):
    """gcsfs's 403 (a plain OSError "Forbidden: ...") and botocore's NoCredentialsError were
    retried as transient (6 attempts, ~8 s) and s3fs's PermissionError named no fix."""
    import gcsfs.retry

    url, server = bucket
    spec = f"{url}/deny/prose.rox"
    upload(spec, server)
    store = grain_rox._format._object_store.store_for(spec, server.storage_options)
    options = server.storage_options
    if server.protocol == "gs":

        async def forbidden(*args, **kwargs):  # what gcsfs raises for a 403 answer
            gcsfs.retry.validate_response(403, b'{"error": {"message": "denied"}}', spec)

        monkeypatch.setattr(store.fs, "_call", forbidden)
    else:  # no credentials anywhere
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                     "AWS_PROFILE"):  # fmt: skip
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        options = {k: v for k, v in options.items() if k not in ("key", "secret")}
    object_store_stats(reset=True)
    with pytest.raises(PermissionError) as denied:
        open_rox(spec, storage_options=options)
    assert object_store_stats().retries == 0
    assert str(denied.value).startswith(f"{spec}: ")
    assert "was denied (" in str(denied.value)
    assert "Fix: check the credentials (storage_options" in str(denied.value)


def test_one_member_written_over_a_set_in_a_bucket_is_refused_not_the_set_deleted(bucket):
    """``x_0001.rox`` written with if_exists='overwrite' over a bucket's set x: the publish
    recorded that member only and deleted the set's other shards without a word."""
    url, server = bucket
    spec = f"{url}/mem/prose.rox"
    result = upload(spec, server)
    member = f"{url}/mem/prose_0001.rox"
    for if_exists in ("overwrite", "error"):
        with pytest.raises(ValueError) as refused:
            write_rox(DOCS[:3], member, tokenizer="bytes", if_exists=if_exists,
                      storage_options=server.storage_options)  # fmt: skip
        assert str(refused.value).startswith(
            f"{member}: writing one member of a set in a bucket would replace the whole set, "
            f"whose other {len(result.paths) - 1} shard object(s) (prose_0000.rox, "
            "prose_0002.rox,"
        )
    corpus = open_rox(spec, storage_options=server.storage_options, verify=True)
    assert corpus.paths == result.paths and corpus.num_documents == len(DOCS)


def test_a_stopped_server_is_retried_until_it_is_back(bucket, monkeypatch):
    url, server = bucket
    spec = f"{url}/retry/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    monkeypatch.setenv("GRAIN_ROX_OBJECT_ATTEMPTS", "10")
    monkeypatch.setenv("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.2")
    grain_rox._format._block_cache.shared_cache().clear()
    object_store_stats(reset=True)
    server.stop()
    restart = threading.Timer(1.5, server.start)
    restart.start()
    try:
        tokens = corpus.tokens(0, 1000)
    finally:
        restart.join()
    assert tokens[:20].tolist() == list(DOCS[0].encode()[:20])
    # s3fs here is set to one attempt (botocore's max_attempts=1), so our retries carried the
    # read through; gcsfs retries a refused connection itself (6 tries, backoff up to 32 s).
    assert object_store_stats().retries >= (1 if server.protocol == "s3" else 0)


def test_a_server_that_stays_down_fails_naming_the_url(s3_server, s3_bucket, monkeypatch):
    # S3 only: gcsfs retries a refused connection itself for about 34 s per request before
    # our attempts start, which this suite does not wait for.
    url, server = s3_bucket, s3_server
    spec = f"{url}/down/prose.rox"
    upload(spec, server)
    corpus = open_rox(spec, storage_options=server.storage_options)
    grain_rox._format._block_cache.shared_cache().clear()
    monkeypatch.setenv("GRAIN_ROX_OBJECT_ATTEMPTS", "2")
    monkeypatch.setenv("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.05")
    server.stop()
    try:
        # the first read of a shard looks its version up, then reads: either names the URL
        failed = r"prose_0000\.rox: (looking up the object|reading 1 byte range\(s\)) failed 2"
        with pytest.raises(OSError, match=failed):
            corpus.tokens(0, 1000)
    finally:
        server.start()


def test_retries_stop_at_the_deadline_and_each_is_logged(monkeypatch, caplog):
    """An endpoint that takes connections and never answers cost a client minutes an attempt
    (its own retries and timeouts): six attempts of ours on top came to ~40 minutes without a
    word. No attempt starts past GRAIN_ROX_OBJECT_DEADLINE, and each retry is logged."""
    import logging

    from grain_rox._format._object_store import ObjectStore

    monkeypatch.setenv("GRAIN_ROX_OBJECT_ATTEMPTS", "100")
    monkeypatch.setenv("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.05")
    monkeypatch.setenv("GRAIN_ROX_OBJECT_DEADLINE", "1")
    tries = []

    def silent_endpoint():  # each attempt waits for its timeout, then fails
        tries.append(time.monotonic())
        time.sleep(0.3)
        raise TimeoutError("read timeout")

    start = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="grain_rox"),
        pytest.raises(
            OSError,
            # (the last attempt, cut at the deadline, may be the one that got no answer)
            match=r"^s3://b/x\.rox: reading (failed \d+ times in 1 s \(TimeoutError: read "
            r"timeout\)|got no answer in 1 s \(\d+ times\): the endpoint takes connections but "
            r"does not answer)\. .*GRAIN_ROX_OBJECT_DEADLINE",
        ),  # fmt: skip
    ):
        ObjectStore("s3").call("reading", "s3://b/x.rox", silent_endpoint)
    assert 2 <= len(tries) <= 4 and time.monotonic() - start < 2
    retried = [r.getMessage() for r in caplog.records]
    assert len(retried) == len(tries) - 1
    assert retried[0].startswith("s3://b/x.rox: reading failed (TimeoutError: read timeout); "
                                 "retrying in ")  # fmt: skip
    assert retried[0].endswith("(attempt 2 of 100)")


def test_a_batch_costs_two_round_trips_at_most_a_request_per_window_none_when_cached(bucket):
    url, server = bucket
    spec = f"{url}/req/prose.rox"
    write_rox(DOCS, spec, tokenizer="bytes", block_size=4096, max_shard_bytes=40_000,
              storage_options=server.storage_options)  # fmt: skip
    fresh = open_rox(spec, storage_options=server.storage_options)
    object_store_stats(reset=True)
    pipe = TokenPipeline(fresh, seq_len=128, global_batch_size=32)
    assert pipe.plan.num_batches is None  # resolved: reads the last shard's padding
    assert object_store_stats().calls <= 2, object_store_stats()
    object_store_stats(reset=True)
    pipe.map_dataset()[5]
    # The first read of each shard in a process checks its version: those of a batch's
    # shards together, in one listing, then the windows and the pieces.
    assert object_store_stats().calls <= 3, object_store_stats()
    assert sum(m is not None for m in fresh._maps) >= 3  # the batch did touch several shards
    corpus = open_rox(spec, storage_options=server.storage_options)
    for s in range(len(corpus.paths)):  # each shard's version checked: mapped for a process
        corpus.shard_index(s)
    data = TokenPipeline(corpus, seq_len=128, global_batch_size=32).map_dataset()
    touched = []
    for k in range(3, 8):
        grain_rox._format._block_cache.shared_cache().clear()
        object_store_stats(reset=True)
        first = data[k]
        cold = object_store_stats(reset=True)
        again = data[k]
        warm = object_store_stats()
        # Every shard the batch touches in one round trip, and the windows that cross a
        # chunk join (copied piece by piece) in one more.
        assert cold.calls <= 2, cold
        assert 1 <= cold.requests <= 32
        assert warm.calls == warm.requests == 0 and warm.cache_hits >= 1
        np.testing.assert_array_equal(first["inputs"], again["inputs"])
        touched.append(cold.cache_misses)
    assert max(touched) > 1  # the batches do span several blocks (and shards)


def test_the_cli_converts_into_inspects_and_verifies_a_bucket(bucket, capsys):
    url, server = bucket
    out = f"{url}/cli/prose.rox"
    with server.environment():
        assert main(["convert", "--builtin", "prose", "--limit", "50", "-o", out,
                     "--no-progress"]) == 0  # fmt: skip
        printed = capsys.readouterr().out
        assert "verified 1 shard(s): checksums match" in printed
        assert main(["verify", out, "--json"]) == 0
        reports = json.loads(capsys.readouterr().out)
        assert [(r["path"], r["checksum"]) for r in reports] == [(out, "ok")]
        assert main(["inspect", out, "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["files"][0]["path"] == out and info["documents"] == 50


@pytest.mark.slow
def test_grain_worker_processes_read_the_bucket(gcs_server, gcs_bucket, local_set):
    # The workers are spawned: they unpickle the corpus without its connections and reach the
    # emulator through the environment they inherit, as a training job's workers would.
    spec = f"{gcs_bucket}/workers/prose.rox"
    upload(spec, gcs_server)
    want = TokenPipeline(local_set, seq_len=64, global_batch_size=8).map_dataset()
    with gcs_server.environment():
        pipe = TokenPipeline(spec, seq_len=64, global_batch_size=8, num_epochs=1)
        for k, got in enumerate(pipe.data_loader(worker_count=2)):
            for key in got:
                np.testing.assert_array_equal(got[key], want[k][key], err_msg=f"{k} {key}")
            if k == 12:
                break
        else:
            pytest.fail("the loader ended early")


def test_a_corpus_opened_with_storage_options_feeds_a_pipeline(s3_server, s3_bucket, local_set):
    # No environment: the options travel inside the opened corpus (and would to workers).
    spec = f"{s3_bucket}/opts/prose.rox"
    upload(spec, s3_server)
    corpus = open_rox(spec, storage_options=s3_server.storage_options)
    remote = TokenPipeline(corpus, seq_len=64, global_batch_size=8).map_dataset()
    local = TokenPipeline(local_set, seq_len=64, global_batch_size=8).map_dataset()
    for k in [0, 5]:
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(remote))[k]["inputs"],
                                      local[k]["inputs"])  # fmt: skip


def test_opening_a_set_of_many_shards_costs_a_few_round_trips_not_one_per_shard(bucket):
    url, server = bucket
    spec = f"{url}/many/prose.rox"
    write_rox(DOCS, spec, tokenizer="bytes", block_size=4096, max_shard_bytes=40_000,
              storage_options=server.storage_options)  # fmt: skip
    object_store_stats(reset=True)
    corpus = open_rox(spec, storage_options=server.storage_options)
    _ = corpus.fingerprint
    stats = object_store_stats()
    assert len(corpus.paths) >= 20
    # Resolving the set name (an existence check and a listing), one listing for every
    # shard's size and version, one concurrent batch of footer reads, the manifest and the
    # listing it is checked against, one batch of fingerprint samples; and the set name
    # resolved again after the facts (a write that finished in between is seen).
    assert stats.calls <= 11, stats
    assert stats.requests >= 2 * len(corpus.paths)  # footers and samples, sent concurrently


def test_the_grain_sources_read_a_bucket_as_local_files(bucket, local_set, caplog):
    url, server = bucket
    spec = f"{url}/src/prose.rox"
    upload(spec, server)
    remote = open_rox(spec, storage_options=server.storage_options)
    for source in (grain_rox.RoxTokenSource, grain_rox.RoxDocumentSource):
        theirs, ours = source(local_set, seq_len=64), source(remote, seq_len=64)
        assert len(ours) == len(theirs)
        for i in [0, 1, len(ours) // 2, len(ours) - 1]:
            want, got = theirs[i], ours[i]
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{source} {i}")
    assert "finding the documents reads every token once in this process" in caplog.text
    blocks = grain_rox.RoxBlockSource(remote)
    np.testing.assert_array_equal(blocks[3], grain_rox.RoxBlockSource(local_set)[3])
    stream = grain_rox.roxxel_stream(remote, batch_size=4, seq_len=32, seed=1)
    local_stream = grain_rox.roxxel_stream(local_set, batch_size=4, seq_len=32, seed=1)
    for k in range(3):
        np.testing.assert_array_equal(np.asarray(stream[k]), np.asarray(local_stream[k]))


KILLED_WRITER = """
import os, sys, time
import grain_rox
from grain_rox._format._object_store import store_for

spec = sys.argv[1]
store = store_for(spec)
real_put = store.fs.put_file
done = []

def put_then_hang(*args, **kwargs):  # the second shard never finishes: SIGKILL comes first
    if len(done) == 1:
        print("KILL ME", flush=True)
        time.sleep(120)
    result = real_put(*args, **kwargs)
    done.append(args)
    return result

store.fs.put_file = put_then_hang
docs = list(grain_rox.builtin_documents("prose"))[:400][::-1]
grain_rox.write_rox(docs, spec, tokenizer="bytes", block_size=4096, max_shard_bytes=200_000,
                    if_exists="overwrite")
"""


@pytest.mark.slow
def test_a_writer_process_killed_mid_upload_leaves_nothing_that_opens(gcs_server, gcs_bucket):
    import os
    import signal
    import subprocess
    import sys

    spec = f"{gcs_bucket}/sigkill/prose.rox"
    upload(spec, gcs_server)
    env = {**os.environ, **gcs_server.env}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, spec], env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "KILL ME"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    with pytest.raises(RoxFormatError, match="has not finished"):
        open_rox(spec, storage_options=gcs_server.storage_options)
    upload(spec, gcs_server, docs=DOCS[::-1], if_exists="overwrite")
    assert open_rox(spec, storage_options=gcs_server.storage_options, verify=True).num_documents


def test_a_set_that_lost_a_shard_is_refused_in_a_bucket_as_on_disk(tmp_path):
    """A hole in a manifest-less set's shard numbers is a lost shard, in a bucket too."""
    import fsspec

    root = f"memory://lost-{os.getpid()}-{tmp_path.name}"
    write_rox(
        [np.arange(1000, dtype=np.uint16)],
        f"{tmp_path}/t/s.rox",
        block_size=64,
        max_shard_bytes=400,
        manifest=False,
    )  # fmt: skip (a bucket's write has one)
    (tmp_path / "t" / "s_0002.rox").unlink()
    memory = fsspec.filesystem("memory")
    for shard in (tmp_path / "t").iterdir():
        memory.pipe_file(f"{root}/t/{shard.name}".split("://", 1)[1], shard.read_bytes())
    for base in (str(tmp_path), root):
        for spec in (f"{base}/t/s.rox", f"{base}/t/", f"{base}/t"):
            shown = re.escape(f"{spec}: the shard set ") + r"\S+/t/s\.rox has no s_0002\.rox: "
            with pytest.raises(FileNotFoundError, match=shown):
                open_rox(spec)
        assert len(open_rox(f"{base}/t/s_*.rox").paths) == len(os.listdir(tmp_path / "t"))


def test_a_shard_replaced_under_an_open_corpus_is_refused_on_a_store_without_versions(
    tmp_path, caplog
):
    """GCS and S3 reads ask for the version opened; other stores (memory://, az://, ...) read
    the current object, so one replaced at the same size after its first read was mixed into
    the corpus, silently. Each read now looks the objects up again."""
    import fsspec

    url = f"memory://unpinned-{os.getpid()}-{tmp_path.name}/d/t.rox"
    docs = [np.arange(1, 2000, dtype=np.uint16) + i for i in range(100)]  # 400 kB
    # 256 kB shards: reads of 64 kB blocks (the first read caches one)
    write_rox(docs, url, block_size=1024, max_shard_bytes=1 << 18, separator=0)
    write_rox([np.full_like(d, 7) for d in docs], str(tmp_path / "t.rox"), block_size=1024,
              max_shard_bytes=1 << 18, separator=0)  # fmt: skip
    corpus = open_rox(url)
    first = corpus.paths[0]
    assert np.asarray(corpus.tokens(0, 10)).tolist() == list(range(1, 11))
    memory = fsspec.filesystem("memory")
    replacement = (tmp_path / os.path.basename(first)).read_bytes()
    assert len(replacement) == memory.size(first)
    memory.pipe_file(first.split("://", 1)[1], replacement)
    with pytest.raises(RoxFormatError, match=re.escape(
        f"{first}: the object was rewritten or removed after the corpus was opened"
    )):  # fmt: skip
        corpus.tokens(0, corpus.num_tokens)
    assert "this store (memory://) reports no content hashes for its objects" in caplog.text


def test_a_retried_upload_whose_store_reports_no_md5_is_told_apart_by_its_bytes(
    tmp_path, monkeypatch
):
    """An upload that took effect but lost its answer is retried and finds its name taken;
    where the store reports no md5 (an S3 multipart ETag, memory://), it was always called
    "another writer", and the set stayed pending. The object is read back and compared."""
    import fsspec

    memory = fsspec.filesystem("memory")
    real = type(memory).put_file
    lost: set[str] = set()
    other: dict[str, bytes] = {}

    def answer_lost(self, lpath, rpath, *args, **kwargs):
        if str(rpath).endswith(".rox") and rpath not in lost:
            lost.add(rpath)
            if other:  # another writer's bytes take the name first
                self.pipe_file(rpath, other["bytes"])
            else:
                real(self, lpath, rpath, *args, **kwargs)
            raise ConnectionError("the answer was lost after the upload took effect")
        return real(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(type(memory), "put_file", answer_lost)
    monkeypatch.setenv("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.01")
    root = f"memory://lost-answer-{os.getpid()}-{tmp_path.name}"
    docs = [np.arange(1, 3000, dtype=np.uint16)] * 3
    write_rox(docs, f"{root}/a/t.rox", separator=0)
    assert open_rox(f"{root}/a/t.rox").tokens(0, 3).tolist() == [1, 2, 3]
    other["bytes"] = b"x" * 100
    with pytest.raises(FileExistsError, match=r"another writer uploaded the shard first"):
        write_rox(docs, f"{root}/b/t.rox", separator=0)


def test_a_write_over_an_unfinished_one_says_it_is_unfinished(tmp_path, monkeypatch):
    """After a write failed mid-upload, the next write (if_exists='error') said only that the
    set "already exists", not that it is an unfinished write."""
    import grain_rox._format._object_upload as upload

    real, calls = upload._upload, []

    def fails_second(store, path, url, md5):
        calls.append(url)
        if len(calls) == 2:
            raise OSError("the writer died mid-upload")
        real(store, path, url, md5)

    url = f"memory://unfinished-{os.getpid()}-{tmp_path.name}/d/t.rox"
    docs = [np.arange(1, 3000, dtype=np.uint16)] * 4
    monkeypatch.setattr(upload, "_upload", fails_second)
    with pytest.raises(OSError, match="the writer died mid-upload"):
        write_rox(docs, url, separator=0, block_size=1024, max_shard_bytes=8192)
    monkeypatch.setattr(upload, "_upload", real)
    with pytest.raises(FileExistsError, match=re.escape(
        f"{url}: the shard set is an unfinished write (its manifest is pending: a write was "
        "killed, or runs) (1 shard object(s), and its manifest). Fix: pass if_exists='overwrite'"
    )):  # fmt: skip
        write_rox(docs, url, separator=0, block_size=1024, max_shard_bytes=8192)
    write_rox(docs, url, separator=0, block_size=1024, max_shard_bytes=8192, if_exists="overwrite")
    assert open_rox(url).tokens(0, 2).tolist() == [1, 2]


@pytest.mark.parametrize("protocol", ["gs", "s3"])
def test_an_endpoint_that_never_answers_fails_within_the_deadline(protocol, monkeypatch):
    """A GCS client waited for ever on an endpoint that takes connections and never answers
    (an S3 one ~400 s an attempt, then said to wait longer)."""
    import socket
    import threading
    import time

    pytest.importorskip("gcsfs" if protocol == "gs" else "s3fs")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []

    def take_connections() -> None:  # and never answer them
        with contextlib.suppress(OSError):  # (closed at the end)
            while True:
                held.append(listener.accept())

    threading.Thread(target=take_connections, daemon=True).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    options = (
        {"endpoint_url": endpoint, "token": "anon", "project": "t"}
        if protocol == "gs"
        else {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
    )
    monkeypatch.setenv("GRAIN_ROX_OBJECT_DEADLINE", "2")
    start = time.monotonic()
    with pytest.raises(OSError, match=rf"^{protocol}://never/d/t\.rox: .* got no answer in 2 s "
                       r"\(once\): the endpoint takes connections but does not answer"):  # fmt: skip
        open_rox(f"{protocol}://never/d/t.rox", storage_options=options)
    assert time.monotonic() - start < 30
    listener.close()
