"""Real servers for the Python client's tests.

The Go test ``TestPythonClient`` (``go test ./clients -run TestPython``)
builds starlease, starts a RabbitMQ broker and a CouchDB-protocol server on
127.0.0.1, creates the fenced databases and runs this suite with
STARLEASE_TEST_BIN, STARLEASE_TEST_AMQP_URL, STARLEASE_TEST_COUCHDB_URL and
STARLEASE_TEST_FENCED_DBS set. The fixtures here start ``starlease serve``
processes themselves (on bolt, with the relay), so tests can kill and
restart them. Without that environment the suite fails loudly: nothing is
skipped.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import starlease  # noqa: E402

TENANT, PROGRAM = "tenant-a", "program-a"
SCOPE = "tenant:%s,program:%s" % (TENANT, PROGRAM)


def _env(name: str) -> str:
    v = os.environ.get(name, "")
    if not v:
        pytest.fail("%s is not set: run this suite through `go test ./clients -run TestPython` "
                    "(it starts the servers and sets STARLEASE_TEST_*)" % name, pytrace=False)
    return v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Key:
    principal: str
    api_key: str = field(repr=False)  # a secret: never in a failure report
    credential_id: str = ""


class Server:
    """A ``starlease serve`` process on bolt with its relay."""

    def __init__(self, bin_path: str, tmp: str, amqp_url: str, *extra: str) -> None:
        self.bin = bin_path
        self.dir = tmp
        self.data = os.path.join(tmp, "data")
        self.pepper = os.path.join(tmp, "pepper")
        with open(self.pepper, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(self.pepper, 0o600)
        self.url_file = os.path.join(tmp, "rabbitmq-url")
        with open(self.url_file, "w") as f:
            f.write(amqp_url + "\n")
        os.chmod(self.url_file, 0o600)
        self.extra = list(extra)
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.log = open(os.path.join(tmp, "serve.log"), "ab")

    @property
    def base(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARLEASE_")}
        args = [self.bin, "serve", "--data-dir", self.data, "--pepper-file", self.pepper,
                "--listen", "127.0.0.1:%d" % self.port, "--rabbitmq-url-file", self.url_file,
                "--relay-poll-interval", "50ms", "--relay-lease-ttl", "3s"] + self.extra
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=self.log, start_new_session=True)
        limit = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("starlease serve exited during start: %s" % self.tail())
            try:
                with urllib.request.urlopen(self.base + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > limit:
                raise RuntimeError("starlease serve not ready within 20 s: %s" % self.tail())
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def create_key(self, principal: str, cls: str = "api_client", caps: str = "targets:lease",
                   scope: str = SCOPE) -> Key:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARLEASE_")}
        out = subprocess.run([self.bin, "keys", "create", "--data-dir", self.data, "--pepper-file", self.pepper,
                              "--principal", principal, "--class", cls, "--capabilities", caps, "--scope", scope],
                             env=env, capture_output=True, check=True, timeout=30)
        got = json.loads(out.stdout)
        return Key(principal, got["api_key"], got["credential"]["credential_id"])

    def client(self, key: Key, **kw) -> starlease.Client:
        return starlease.Client(self.base, key.api_key, **kw)


@dataclass
class Env:
    bin: str
    amqp_url: str
    couch_url: str
    fenced_dbs: List[str]


@pytest.fixture(scope="session")
def env() -> Env:
    return Env(_env("STARLEASE_TEST_BIN"), _env("STARLEASE_TEST_AMQP_URL"), _env("STARLEASE_TEST_COUCHDB_URL"),
               _env("STARLEASE_TEST_FENCED_DBS").split(","))


@pytest.fixture(scope="session")
def server(env: Env, tmp_path_factory) -> Iterator[Server]:
    """The shared server (tests use unique targets)."""
    s = Server(env.bin, str(tmp_path_factory.mktemp("serve")), env.amqp_url)
    s.start()
    yield s
    s.stop()
    assert s.proc is not None and s.proc.returncode == 0, "serve did not exit cleanly: %s" % s.tail()


@pytest.fixture
def own_server(env: Env, tmp_path) -> Iterator[Server]:
    """A server of the test's own, which it may kill and restart."""
    s = Server(env.bin, str(tmp_path), env.amqp_url)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def keys(server: Server) -> Dict[str, Key]:
    return {
        "actor": server.create_key("prn-py-actor"),
        "other": server.create_key("prn-py-other"),
        "admin": server.create_key("prn-py-admin", "administrator", "targets:lease,targets:read,targets:force-release,audit:read"),
        "elsewhere": server.create_key("prn-py-elsewhere", scope="tenant:tenant-b,program:program-b"),
    }


@pytest.fixture
def client(server: Server, keys: Dict[str, Key]) -> starlease.Client:
    return server.client(keys["actor"])


@pytest.fixture
def admin(server: Server, keys: Dict[str, Key]) -> starlease.Client:
    return server.client(keys["admin"])


def unique(prefix: str) -> str:
    return "%s-%s" % (prefix, secrets.token_hex(4))


def identity(target: Optional[str] = None, actor: str = "pyenricher") -> starlease.LockIdentity:
    return starlease.LockIdentity(TENANT, PROGRAM, "web", target or unique("example") + ".com", actor)


@pytest.fixture
def fenced_db(env: Env) -> starlease.CouchDB:
    return starlease.CouchDB(env.couch_url + "/" + env.fenced_dbs[0])


class DroppingProxy:
    """A TCP proxy to upstream that forwards each request but, for the
    first ``drop`` connections, closes the client's side as soon as the
    server answers: the request was applied and its answer lost."""

    def __init__(self, upstream_port: int, drop: int) -> None:
        self.upstream = upstream_port
        self.drop = drop
        self.dropped = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            drop = self.dropped < self.drop
            if drop:
                self.dropped += 1
            threading.Thread(target=self._serve, args=(c, drop), daemon=True).start()

    def _serve(self, c: socket.socket, drop: bool) -> None:
        u = socket.create_connection(("127.0.0.1", self.upstream))

        def pump(src: socket.socket, dst: socket.socket, drop_answer: bool) -> None:
            try:
                while True:
                    b = src.recv(65536)
                    if not b:
                        break
                    if drop_answer:
                        break
                    dst.sendall(b)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(c, u, False), daemon=True).start()
        pump(u, c, drop)
        c.close()
        u.close()

    def close(self) -> None:
        self.sock.close()
