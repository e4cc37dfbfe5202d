"""A real S3 API on loopback for the remote-dataset tests: moto's server in its own process,
a bucket per test holding MDS datasets, and a TCP proxy that can drop a connection.

    from tests.data.s3_server import moto_server, serve_mds  # noqa: F401  (pytest fixtures)

    def test_something(serve_mds, tmp_path):
        env, uris, proxy = serve_mds({"train_a": "/path/to/mds_dir"})
        # os.environ now holds `env` (S3_ENDPOINT_URL points at the proxy); pass `env` on to
        # subprocesses. uris["train_a"] == "s3://<bucket>/mds/train_a"
        proxy.drop_next("shard.00001.mds")  # that object's next request: connection closed

The server enforces credentials (moto's IAM authentication): the environment carries the
keys of an IAM user the fixture created, and a request signed with any other key is
refused (InvalidAccessKeyId / SignatureDoesNotMatch), as on AWS.

Environment mosaic's S3 client reads (streaming/base/storage/download.py, S3Downloader):
`boto3.session.Session().client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL"))`, so
S3_ENDPOINT_URL plus the standard boto credential chain (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, config files, instance metadata)
and AWS_DEFAULT_REGION. The env returned here pins all of them so that nothing of the
developer's own AWS set-up (~/.aws, profiles, an EC2 role) leaks into a test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest

from orchestrator.runtime.ports import free_port

REGION = "us-east-1"
ACCOUNT_POLICY = """{"Version": "2012-10-17",
 "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}"""
# Variables that would otherwise let the host's AWS set-up change what the client does.
_AWS_VARS_TO_CLEAR = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                      "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                      "MOSAICML_STREAMING_AWS_REQUESTER_PAYS")


def _wait_for_port(port: int, proc: Optional[subprocess.Popen], timeout: float, log: Optional[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"moto server exited with code {proc.returncode} before listening:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def base_env(endpoint: str, access_key: str, secret_key: str) -> Dict[str, str]:
    """What a boto3/mosaic client in this process or a child needs to reach `endpoint`.
    Values of "" mean: remove that variable (see apply_env)."""
    env = {"S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
           "AWS_DEFAULT_REGION": REGION,
           # No ~/.aws files and no instance-metadata probe (it takes seconds to time out).
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true"}
    env.update({k: "" for k in _AWS_VARS_TO_CLEAR})
    # Loopback never through an HTTP(S)_PROXY the environment may set (botocore honours them).
    for var in ("NO_PROXY", "no_proxy"):
        env[var] = ",".join(p for p in (os.environ.get(var, ""), "127.0.0.1,localhost") if p)
    return env


def apply_env(env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env.items():
        if value == "":
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def child_env(env: Dict[str, str], base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """os.environ (or `base`) with `env` applied, for subprocess.run(env=...)."""
    out = dict(os.environ if base is None else base)
    for key, value in env.items():
        if value == "":
            out.pop(key, None)
        else:
            out[key] = value
    return out


@dataclass
class MotoServer:
    """moto's server (all AWS services on one port) in a child process."""

    port: int
    proc: subprocess.Popen
    log: Path
    access_key: str = ""
    secret_key: str = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, log_dir: Path, timeout: float = 30.0) -> "MotoServer":
        last: Optional[Exception] = None
        for _ in range(3):  # a free port can be taken between free_port() and the bind
            port = free_port()
            log = log_dir / f"moto-{port}.log"
            env = child_env({}, dict(os.environ))
            env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)  # open until enable_auth()
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                        stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
            try:
                _wait_for_port(port, proc, timeout, log)
                return cls(port, proc, log)
            except Exception as err:
                last = err
                _stop_process(proc)
        raise RuntimeError(f"could not start moto server: {last}")

    def client(self, service: str, access_key: str = "any", secret_key: str = "any"):
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            service, endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            # proxies={}: never through an HTTP(S)_PROXY of the environment, the server is local.
            config=Config(retries={"mode": "standard", "max_attempts": 2}, proxies={}))

    def enable_auth(self) -> None:
        """Create an IAM user allowed s3:*, keep its keys, then make the server check every
        request's signature against IAM (moto's INITIAL_NO_AUTH_ACTION_COUNT set to 0 at run
        time through its /moto-api/reset-auth endpoint)."""
        import urllib.request

        iam = self.client("iam")
        user = f"audiollm-test-{uuid.uuid4().hex[:6]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="s3-all", PolicyDocument=ACCOUNT_POLICY)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        # Not form-encoded (urllib's default type), or Flask hands moto an empty body.
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as resp:
            assert resp.status == 200, resp.read()

    def s3(self):
        """An S3 client with the server's valid credentials (talks to moto directly)."""
        return self.client("s3", self.access_key or "any", self.secret_key or "any")

    def env(self, endpoint: Optional[str] = None) -> Dict[str, str]:
        return base_env(endpoint or self.endpoint, self.access_key, self.secret_key)

    def stop(self) -> None:
        _stop_process(self.proc)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, even by SIGKILL, so
    no server outlives an interrupted run (Linux; elsewhere teardown alone stops it)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def upload_dir(s3, local_dir: Path, bucket: str, prefix: str) -> List[str]:
    """Every file under local_dir -> s3://bucket/prefix/<relative path>; returns the keys."""
    keys = []
    for path in sorted(Path(local_dir).rglob("*")):
        if path.is_file():
            key = f"{prefix.strip('/')}/{path.relative_to(local_dir).as_posix()}"
            s3.upload_file(str(path), bucket, key)
            keys.append(key)
    return keys


# --------------------------------------------------------------------------- flaky proxy
@dataclass
class FlakyProxy:
    """A TCP proxy on 127.0.0.1 in front of an HTTP server that speaks HTTP/1.1 just enough
    to see each request's path: it can close a client's connection, without any reply, on
    the next request(s) whose path contains a given string, and forwards everything else.

    Each forwarded request goes to the upstream on its own connection with
    `Connection: close`, and the upstream's reply is relayed until the upstream closes, so
    no response framing has to be parsed. Requests must carry their body with
    Content-Length (all that S3 reads need); meant for reads, uploads go to moto directly."""

    upstream_port: int
    port: int = 0
    requests: List[str] = field(default_factory=list)  # "METHOD path" of every request seen
    dropped: List[str] = field(default_factory=list)  # those whose connection was closed
    _rules: Dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: Optional[socket.socket] = None
    _thread: Optional[threading.Thread] = None
    _closing: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_next(self, path_contains: str, times: int = 1) -> None:
        """The next `times` requests whose path contains `path_contains` are answered by
        closing the connection; later ones are forwarded."""
        with self._lock:
            self._rules[path_contains] = self._rules.get(path_contains, 0) + times

    def start(self) -> "FlakyProxy":
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(64)
        self._sock.settimeout(0.1)  # accept() wakes up to see stop(); closing alone does not wake it
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name=f"flaky-proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)  # accepted sockets inherit the listening socket's timeout
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _should_drop(self, path: str) -> bool:
        with self._lock:
            for needle, left in self._rules.items():
                if left > 0 and needle in path:
                    self._rules[needle] = left - 1
                    return True
        return False

    def _serve(self, client: socket.socket) -> None:
        buf = b""
        try:
            with client:
                client.settimeout(60)
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = client.recv(65536)
                        if not chunk:
                            return  # client closed its keep-alive connection
                        buf += chunk
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    method, path = lines[0].split(" ")[:2]
                    headers = [ln for ln in lines[1:] if ln]
                    length = 0
                    for ln in headers:
                        name, _, value = ln.partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value.strip())
                        if name.strip().lower() == "transfer-encoding":
                            raise ValueError("FlakyProxy does not forward chunked request bodies")
                    while len(buf) < length:
                        chunk = client.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    body, buf = buf[:length], buf[length:]
                    self.requests.append(f"{method} {path}")
                    if self._should_drop(path):
                        self.dropped.append(f"{method} {path}")
                        return  # `with client` closes it: no status line, no bytes
                    kept = [ln for ln in headers if ln.split(":", 1)[0].strip().lower() not in ("connection",
                                                                                              "keep-alive")]
                    request = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1") + body
                    keep_alive = self._relay(request, client)
                    if not keep_alive:
                        return
        except (OSError, ValueError):
            return

    def _relay(self, request: bytes, client: socket.socket) -> bool:
        """Sends one request upstream and its whole reply back; False when the client must
        be disconnected (the reply said so, or the upstream failed)."""
        with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60) as up:
            up.sendall(request)
            first = True
            close_client = True
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                if first:
                    # The client may reuse its connection only if the reply is framed (every
                    # werkzeug reply carries Content-Length); the "Connection: close" header
                    # the upstream added for our request is removed so it keeps doing so.
                    head_end = chunk.find(b"\r\n\r\n")
                    head = chunk[:head_end].decode("latin-1") if head_end >= 0 else ""
                    lower = head.lower()
                    if "content-length:" in lower and "transfer-encoding" not in lower:
                        close_client = False
                        kept = [ln for ln in head.split("\r\n") if ln.split(":", 1)[0].strip().lower() != "connection"]
                        chunk = "\r\n".join(kept).encode("latin-1") + chunk[head_end:]
                    first = False
                client.sendall(chunk)
        return not close_client


# --------------------------------------------------------------------------- fixtures
class ServedMDS(NamedTuple):
    env: Dict[str, str]  # set in os.environ by the fixture; pass to subprocesses (child_env)
    uris: Dict[str, str]  # dataset name -> s3://bucket/prefix/name
    proxy: FlakyProxy  # S3_ENDPOINT_URL in env points here


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """One moto server for the session, with IAM authentication on (server.access_key and
    server.secret_key are the valid keys)."""
    server = MotoServer.start(tmp_path_factory.mktemp("moto"))
    try:
        server.enable_auth()
        yield server
    finally:
        server.stop()


@pytest.fixture
def serve_mds(moto_server, monkeypatch):
    """serve_mds({name: local MDS dir}, bucket=None) -> ServedMDS(env, uris, proxy).

    Uploads each directory (index.json and shards) to a fresh bucket under mds/<name>,
    starts a FlakyProxy in front of moto and puts `env` (endpoint = the proxy, the valid
    keys) into os.environ for the test's duration. Stops its proxies afterwards."""
    proxies: List[FlakyProxy] = []

    def serve(datasets: Dict[str, os.PathLike], bucket: Optional[str] = None) -> ServedMDS:
        bucket = bucket or f"audiollm-{uuid.uuid4().hex[:10]}"
        s3 = moto_server.s3()
        s3.create_bucket(Bucket=bucket)
        uris = {}
        for name, local_dir in datasets.items():
            if not (Path(local_dir) / "index.json").is_file():
                raise FileNotFoundError(f"{local_dir} is not an MDS dataset (no index.json)")
            upload_dir(s3, Path(local_dir), bucket, f"mds/{name}")
            uris[name] = f"s3://{bucket}/mds/{name}"
        proxy = FlakyProxy(moto_server.port).start()
        proxies.append(proxy)
        _wait_for_port(proxy.port, None, 5.0, None)
        env = moto_server.env(proxy.endpoint)
        apply_env(env, monkeypatch)
        return ServedMDS(env, uris, proxy)

    yield serve
    for proxy in proxies:
        proxy.stop()


def served_once(datasets: Dict[str, os.PathLike], log_dir: Path) -> Tuple[MotoServer, ServedMDS]:
    """The same without pytest (scripts, experiments): caller stops server and proxy and
    applies env itself."""
    server = MotoServer.start(log_dir)
    try:
        server.enable_auth()
        s3 = server.s3()
        bucket = f"audiollm-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(Bucket=bucket)
        uris = {}
        for name, local_dir in datasets.items():
            upload_dir(s3, Path(local_dir), bucket, f"mds/{name}")
            uris[name] = f"s3://{bucket}/mds/{name}"
        proxy = FlakyProxy(server.port).start()
    except BaseException:
        server.stop()
        raise
    return server, ServedMDS(server.env(proxy.endpoint), uris, proxy)
