"""Objects in a bucket (``gs://``, ``s3://``, any fsspec URL): what a shard reader asks of them.

:class:`ObjectStore` wraps one fsspec filesystem: object facts (:meth:`ObjectStore.info`:
size, version, content tag), ranged reads issued concurrently in one call
(:meth:`ObjectStore.read_many`), listing, and writes. Every request is retried with
exponential backoff on transient errors (a connection refused, a timeout, a 5xx) and, when
the attempts run out, fails with an ``OSError`` that names the URL and what to check.

Storage options (endpoints, credentials) come from ``storage_options=`` where an API takes
them, else from fsspec's own configuration, which child processes (Grain workers,
``jax.distributed`` peers) inherit through the environment: ``FSSPEC_GCS`` / ``FSSPEC_S3``
(a JSON object of options) or ``FSSPEC_GCS_<OPTION>`` variables, ``STORAGE_EMULATOR_HOST`` for
gcsfs, ``AWS_ENDPOINT_URL`` for s3fs.

>>> is_url("gs://bucket/train.rox"), is_url("/data/train.rox"), is_url("file:///d/t.rox")
(True, False, False)
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

_T = TypeVar("_T")
_log = logging.getLogger("grain_rox")


class ObjectChangedError(OSError):
    """Object ``url`` is no longer ``version``, the one a read was pinned to: it was rewritten
    or removed."""

    def __init__(self, url: str, version: str) -> None:
        super().__init__(
            f"{url}: the object is no longer the version read so far ({version!r}): it was "
            "rewritten or removed"
        )
        self.url, self.version = url, version


_GCS = ("gs", "gcs")
_S3 = ("s3", "s3a")

# Errors that no retry mends: the object is gone or already there (a create-only upload's
# precondition), access is denied, the request is wrong.
_PERMANENT = (
    ObjectChangedError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
)


def is_url(path: object) -> bool:
    """Whether ``path`` names an object through fsspec (``scheme://...``, not ``file://``)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() not in ("file", "local")


def _retry_settings() -> tuple[int, float, float]:
    attempts = int(os.environ.get("GRAIN_ROX_OBJECT_ATTEMPTS", "6"))
    first_delay = float(os.environ.get("GRAIN_ROX_OBJECT_RETRY_DELAY", "0.25"))
    # No attempt starts after this long: a client retries on its own and waits for timeouts
    # in each attempt (an endpoint that took connections and never answered cost s3fs ~7
    # minutes an attempt, 6 attempts ~40 minutes, before this bound)
    deadline = float(os.environ.get("GRAIN_ROX_OBJECT_DEADLINE", "120"))
    return max(1, attempts), max(0.0, first_delay), max(0.0, deadline)


def _precondition_failed(e: BaseException | None) -> bool:
    """Whether ``e`` (or what caused it) is a store's "precondition failed" (HTTP 412)."""
    while e is not None:
        response = getattr(e, "response", None)  # botocore's ClientError, under s3fs's OSError
        if isinstance(response, dict):
            error = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if error.get("Code") == "PreconditionFailed" or status == 412:
                return True
        if getattr(e, "code", None) == 412 or getattr(e, "status", None) == 412:
            return True
        e = e.__cause__
    return False


def _denied(e: BaseException) -> bool:
    """Whether ``e`` is a denial or missing credentials: s3fs's ``PermissionError``, gcsfs's
    403 (a plain ``OSError("Forbidden: ...")``), a 401/403 status, botocore's
    ``NoCredentialsError``."""
    if isinstance(e, PermissionError) or (type(e) is OSError and str(e).startswith("Forbidden")):
        return True
    if type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return True
    return getattr(e, "code", None) in (401, 403) or getattr(e, "status", None) in (401, 403)


class NoAnswerError(TimeoutError):
    """A request that the store did not answer before the deadline."""


def _answered_within(fn: Callable[[], _T], seconds: float) -> _T:
    """``fn()``, or :class:`NoAnswerError` when it has not returned after ``seconds``; it runs
    in a daemon thread, left to its client's own timeouts when given up."""
    answer: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            answer.append((True, fn()))
        except BaseException as e:  # handed to the caller
            answer.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, name="grain_rox object request", daemon=True).start()
    if not done.wait(seconds):
        raise NoAnswerError(f"no answer in {seconds:.0f} s")
    ok, value = answer[0]
    if not ok:
        raise value
    return value


def _permanent(e: BaseException) -> bool:
    if isinstance(e, _PERMANENT) or _precondition_failed(e):  # (a denial is raised before)
        return True
    status = getattr(e, "code", None) or getattr(e, "status", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return True  # a precondition, a bad request, a denial: the answer will not change
    response = getattr(e, "response", None)  # botocore's ClientError
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int) and 400 <= code < 500 and code not in (408, 429):
            return True
    return False


@dataclasses.dataclass
class RequestStats:
    """Requests made to object stores by this process (see :func:`object_store_stats`).

    Attributes:
      calls: round trips waited for one after another: a lookup, a listing, a write, or one
        concurrent batch of ranged reads (however many ranges it holds).
      requests: ranged reads and whole-object reads sent (one per range in a batch of ranges).
      bytes_read: bytes those requests returned.
      retries: requests sent again after a transient error.
      cache_hits: cache blocks served without a request.
      cache_misses: cache blocks fetched.
    """

    calls: int = 0
    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    cache_hits: int = 0
    cache_misses: int = 0


_stats = RequestStats()
_stats_lock = threading.Lock()


def count(**deltas: int) -> None:
    """Add to this process's :class:`RequestStats` (thread-safe)."""
    with _stats_lock:
        for name, delta in deltas.items():
            setattr(_stats, name, getattr(_stats, name) + delta)


def object_store_stats(*, reset: bool = False) -> RequestStats:
    """This process's object-store request counts so far (a copy); ``reset=True`` zeroes them.

    >>> from grain_rox import object_store_stats
    >>> object_store_stats(reset=True).requests >= 0, object_store_stats().requests
    (True, 0)
    """
    global _stats
    with _stats_lock:
        snapshot = dataclasses.replace(_stats)
        if reset:
            _stats = RequestStats()
    return snapshot


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object's facts when it was looked at.

    Attributes:
      url: the object's full URL.
      size: its size in bytes.
      version: what changes whenever the object is rewritten (GCS's generation, S3's ETag,
        which a listing and a lookup both report, versioned bucket or not; else its
        modification time), or "" when the store reports none.
      content_tag: a hash of the content that the store computed (GCS's crc32c or md5, S3's
        ETag), or "" when it reports none: equal tags mean equal bytes.
      md5: the hex md5 of the bytes where the store reports it (GCS's md5Hash, an S3 ETag of
        a single-part upload), else "".
    """

    url: str
    size: int
    version: str
    content_tag: str
    md5: str = ""


def _first(info: dict[str, Any], *names: str) -> str:
    for name in names:
        value = info.get(name)
        if value not in (None, ""):
            return str(value).strip('"')
    return ""


def _md5_hex(data: dict[str, Any]) -> str:
    """The object's md5 as hex, where the store reports one (see :class:`ObjectInfo`)."""
    gcs = _first(data, "md5Hash")
    if gcs:
        try:
            return base64.b64decode(gcs).hex()
        except ValueError:
            return ""
    etag = _first(data, "ETag", "etag")
    return etag.lower() if re.fullmatch(r"[0-9a-fA-F]{32}", etag) else ""


def _object_info(url: str, data: dict[str, Any]) -> ObjectInfo:
    if data.get("type") == "directory":
        raise IsADirectoryError(f"{url} is a prefix (a directory), not an object")
    return ObjectInfo(
        url=url,
        size=int(data["size"]),
        version=_first(data, "generation", "ETag", "etag", "mtime", "updated", "created"),
        content_tag=_first(data, "crc32c", "md5Hash", "ETag", "etag"),
        md5=_md5_hex(data),
    )


class ObjectStore:
    """One fsspec filesystem, reached by URL, with retries and request counting.

    Args:
      protocol: the URL scheme (``gs``, ``s3``, ``memory``, ...).
      storage_options: options for ``fsspec.filesystem(protocol, ...)``; None uses fsspec's
        configuration and the environment.

    Pickles as its protocol and options; the filesystem is made again where it is unpickled.
    """

    def __init__(self, protocol: str, storage_options: dict[str, Any] | None = None) -> None:
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._pid = 0  # the process that made _fs

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (made on first use, and again in a ``fork()``ed child: the
        parent's refuses use there, "This class is not fork-safe")."""
        if self._fs is None or self._pid != os.getpid():
            try:
                import fsspec
            except ImportError:
                raise ImportError(
                    f"reading {self.protocol}:// URLs needs fsspec and the filesystem for it: "
                    "pip install 'grain_rox[gcs]' (gs://) or 'grain_rox[s3]' (s3://)"
                ) from None
            self._fs = fsspec.filesystem(self.protocol, **self.storage_options)
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "storage_options": self.storage_options,
            "_fs": None,
            "_pid": 0,
        }

    def url(self, path: str) -> str:
        """The full URL of a path the filesystem returned (it strips the scheme)."""
        return path if "://" in path else f"{self.protocol}://{path}"

    def call(self, what: str, url: str, fn: Callable[[], _T], *, bounded: bool = True) -> _T:
        """Run one request, retrying transient errors with exponential backoff and jitter.

        ``GRAIN_ROX_OBJECT_ATTEMPTS`` (default 6) bounds the attempts,
        ``GRAIN_ROX_OBJECT_RETRY_DELAY`` (default 0.25 s) is the first wait, doubled each time,
        and no attempt starts ``GRAIN_ROX_OBJECT_DEADLINE`` (default 120) seconds after the
        first; each retry is logged (a warning). A ``bounded`` request (a lookup, a listing, a
        read: all but uploads, whose time grows with their size) is also given up when that
        deadline passes with no answer: an endpoint that takes connections and never answers
        held a GCS client for ever.
        """
        attempts, delay, deadline = _retry_settings()
        start = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                left = deadline - (time.monotonic() - start)
                result = _answered_within(fn, left) if bounded and left > 0 else fn()
                count(calls=1)
                return result
            except Exception as e:
                if _denied(e):
                    raise PermissionError(
                        f"{url}: {what} was denied ({type(e).__name__}: {e}). Fix: check the "
                        "credentials (storage_options, or fsspec's FSSPEC_* environment and the "
                        "store's own: GOOGLE_APPLICATION_CREDENTIALS, AWS_*) and that they may "
                        "read (or, for a write, write) this bucket"
                    ) from e
                if _permanent(e):
                    raise _naming(e, url, what) from e
                wait = delay * (2 ** (attempt - 1)) * (0.5 + random.random())
                spent = time.monotonic() - start
                if attempt == attempts or spent + wait >= deadline:
                    times = "once" if attempt == 1 else f"{attempt} times"
                    if isinstance(e, NoAnswerError):
                        raise OSError(
                            f"{url}: {what} got no answer in {spent:.0f} s ({times}): the "
                            "endpoint takes connections but does not answer. Fix: check the "
                            "endpoint and that the object store runs there (storage_options, "
                            "or fsspec's FSSPEC_* environment); GRAIN_ROX_OBJECT_DEADLINE sets "
                            "how long to wait"
                        ) from e
                    raise OSError(
                        f"{url}: {what} failed {times} in {spent:.0f} s ({type(e).__name__}: "
                        f"{e}). Fix: check that the object store is reachable and the "
                        "credentials and endpoint are right (storage_options, or fsspec's "
                        "FSSPEC_* environment); raise GRAIN_ROX_OBJECT_ATTEMPTS or "
                        "GRAIN_ROX_OBJECT_DEADLINE to wait longer"
                    ) from e
                _log.warning(
                    "%s: %s failed (%s: %.200s); retrying in %.1f s (attempt %d of %d)",
                    url, what, type(e).__name__, e, wait, attempt + 1, attempts,
                )  # fmt: skip
                count(retries=1)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def info(self, url: str) -> ObjectInfo:
        """The object's size, version and content tag now (one request; not fsspec's cached
        listing, which may predate a rewrite)."""

        def look_up() -> dict[str, Any]:
            self.fs.invalidate_cache(url)
            return self.fs.info(url)

        return _object_info(url, self.call("looking up the object", url, look_up))

    def infos(self, urls: Sequence[str]) -> dict[str, ObjectInfo]:
        """:meth:`info` of many objects: one listing per prefix that holds several of them
        (a set of 1,000 shards opens with one request, not 1,000), one lookup for the rest."""
        by_parent: dict[str, list[str]] = {}
        for url in dict.fromkeys(urls):
            by_parent.setdefault(url.rsplit("/", 1)[0], []).append(url)
        out: dict[str, ObjectInfo] = {}
        for parent, group in by_parent.items():
            if len(group) > 1:
                self.fs.invalidate_cache(parent)
                entries = self.call(
                    "listing the prefix", parent, partial(self.fs.ls, parent, detail=True)
                )
                wanted = set(group)
                for entry in entries:
                    url = self.url(entry["name"])
                    # Only a listing that names versions as info() does (GCS generations,
                    # S3 ETags); others (timestamps in other formats) are looked up one by one.
                    strong = _first(entry, "generation", "ETag", "etag")
                    if url in wanted and strong and entry.get("type") != "directory":
                        out[url] = _object_info(url, entry)
            for url in group:
                if url not in out:
                    out[url] = self.info(url)
        return out

    def read_many(
        self,
        spans: Sequence[tuple[str, int, int]],
        pins: Mapping[str, ObjectInfo | None] | None = None,
    ) -> list[bytes]:
        """Bytes ``[a, b)`` of object ``url`` for each ``(url, a, b)``, of one or many objects,
        requested concurrently in one call.

        ``pins`` names the version of each object to read (its :class:`ObjectInfo` when it was
        opened): on GCS each request asks for that generation, on S3 it carries ``If-Match``
        with that ETag, so a read never returns bytes of a later write; an object rewritten or
        removed since raises :class:`ObjectChangedError`. Other stores read the current object,
        then each pinned object is looked up again: one that changed raises the same error
        (one lookup an object a call; such stores have no version to ask a read for).
        """
        if not spans:
            return []
        urls = [u for u, _, _ in spans]
        starts = [a for _, a, _ in spans]
        ends = [b for _, _, b in spans]
        first = urls[0] if len(set(urls)) == 1 else f"{urls[0]} (and {len(set(urls)) - 1} more)"
        pinned = pins is not None and self.protocol in _GCS + _S3
        found = self.call(
            f"reading {len(spans)} byte range(s)",
            first,
            (lambda: self._read_pinned(spans, pins or {}))
            if pinned
            else (lambda: self.fs.cat_ranges(urls, starts, ends, on_error="raise")),
        )
        if pins is not None and not pinned:
            self._check_unchanged(sorted(set(urls)), pins)
        total = 0
        for (url, a, b), data in zip(spans, found, strict=True):
            if isinstance(data, BaseException):
                raise data
            if len(data) != b - a:
                raise OSError(
                    f"{url}: bytes [{a}, {b}) came back as {len(data)} bytes: the object "
                    "was truncated or replaced while it was read. Fix: reopen the corpus"
                )
            total += len(data)
        count(requests=len(spans), bytes_read=total)
        return list(found)

    def _check_unchanged(self, urls: Sequence[str], pins: Mapping[str, ObjectInfo | None]) -> None:
        """Raise :class:`ObjectChangedError` for an object of ``urls`` whose size or version
        is no longer its pin's (or which is gone): what a store without versioned reads
        returned for it may be another write's bytes."""
        for url in urls:
            pin = pins.get(url)
            if pin is None:
                continue
            try:
                now = self.info(url)
            except FileNotFoundError as e:
                raise ObjectChangedError(url, pin.version) from e
            if (now.size, now.version) != (pin.size, pin.version):
                raise ObjectChangedError(url, pin.version)

    def _read_pinned(
        self, spans: Sequence[tuple[str, int, int]], pins: Mapping[str, ObjectInfo | None]
    ) -> list[bytes]:
        """The spans of the versions ``pins`` names, requested concurrently on the
        filesystem's event loop (fsspec's ``cat_ranges`` takes no per-object version)."""
        from fsspec.asyn import sync

        fs = self.fs

        async def one(url: str, a: int, b: int) -> bytes:
            if b <= a:
                return b""
            pin = pins.get(url)
            version = pin.version if pin is not None else ""
            try:
                if not version:
                    return await fs._cat_file(url, start=a, end=b)
                if self.protocol in _GCS:
                    return await fs._cat_file(url, start=a, end=b, generation=version)
                bucket, key, _ = fs.split_path(url)
                response = await fs._call_s3(
                    "get_object", Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}",
                    IfMatch=f'"{version}"',
                )  # fmt: skip
                try:
                    return await response["Body"].read()
                finally:
                    response["Body"].close()
            except Exception as e:
                if isinstance(e, FileNotFoundError) or _precondition_failed(e):
                    raise ObjectChangedError(url, version) from e
                raise

        async def all_spans() -> list[bytes]:
            return list(await asyncio.gather(*(one(u, a, b) for u, a, b in spans)))

        return sync(fs.loop, all_spans)

    def read_all(self, url: str) -> bytes:
        """The whole object (one request)."""
        data: bytes = self.call("reading the object", url, lambda: self.fs.cat_file(url))
        count(requests=1, bytes_read=len(data))
        return data

    def exists(self, url: str) -> bool:
        return bool(self.call("looking up the object", url, lambda: self.fs.exists(url)))

    def missing_bucket(self, url: str) -> str | None:
        """The bucket of ``url`` (``gs://b``) where the store says it does not exist; None
        where it does, or cannot be told (a store without buckets, or credentials that may
        write objects but not look buckets up)."""
        if self.protocol not in (*_GCS, *_S3):
            return None
        root = f"{self.protocol}://{url.split('://', 1)[1].split('/', 1)[0]}"
        try:
            return None if self.exists(root) else root
        except OSError:  # a denial, say
            return None

    def isdir(self, url: str) -> bool:
        return bool(self.call("looking up the prefix", url, lambda: self.fs.isdir(url)))

    def listdir(self, url: str) -> list[str]:
        """The full URLs of the objects directly under prefix ``url`` (fresh, not cached)."""
        self.fs.invalidate_cache(url)

        def ls() -> list[str]:
            try:
                entries = self.fs.ls(url, detail=True)
            except FileNotFoundError:
                return []
            return [self.url(e["name"]) for e in entries if e.get("type") != "directory"]

        return ls() if not url else self.call("listing the prefix", url, ls)

    def glob(self, pattern: str) -> list[tuple[str, bool]]:
        """The full URLs matching ``pattern``, sorted, each with whether it is a prefix (a
        directory) rather than an object (fresh, not cached)."""
        self.fs.invalidate_cache()
        found = self.call("listing the glob", pattern, lambda: self.fs.glob(pattern, detail=True))
        return sorted((self.url(p), e.get("type") == "directory") for p, e in found.items())


def _naming(e: BaseException, url: str, what: str) -> BaseException:
    """``e`` again, its message naming ``url`` and what was being done (an OSError of the
    same type; other errors as they are)."""
    if not isinstance(e, OSError) or isinstance(e, ObjectChangedError) or url in str(e):
        return e
    detail = e.strerror or (e.args[0] if e.args else "") or type(e).__name__
    try:
        return type(e)(f"{url}: {what}: {detail}")
    except TypeError:  # a subclass whose constructor wants more than a message
        return e


_stores: dict[tuple[str, str], ObjectStore] = {}
_stores_lock = threading.Lock()


def store_for(url: str, storage_options: dict[str, Any] | None = None) -> ObjectStore:
    """The (per process, shared) :class:`ObjectStore` for ``url``'s scheme and options."""
    protocol = url.split("://", 1)[0].lower()
    key = (protocol, repr(sorted((storage_options or {}).items())))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = ObjectStore(protocol, storage_options)
    return store
