"""A real S3-compatible server for the S3 sources: versitygw (github.com/versity/versitygw), built from its Go
module by ``deploy/versitygw/build.sh`` (cached like helm), serving its posix backend with versioning on.

``S3Server`` runs it on a free loopback port with a root access key and secret of its own. It is a real
server, not a mock: it checks every SigV4 signature (headers and presigned URLs, expiry included), keeps each
version of a key in a versioned bucket, validates the ``x-amz-checksum-*`` and ``Content-MD5`` a client
sends (``BadDigest``), stores the checksum of every object (CRC64NVME when the client sent none) and answers
ranged GETs with 206. ``client()`` is a boto3 S3 client for it (path-style, SigV4), with the root's keys or
others (a wrong key to see a refusal). The session's server is the ``s3`` fixture: tests use buckets of their
own. The posix backend maps keys to files, so a key cannot be both an object and a "directory" of others
(``m`` beside ``m/a`` is ``ExistingObjectIsDirectory``), as it can on AWS.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import string
import subprocess
import tempfile
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config

from gpustack_models.local.cluster import free_port
from gpustack_models.local.stopping import die_with_parent
from tests.support.paths import REPO, TEST_STATE
from tests.support.waiting import wait_for

BUILD = REPO / "deploy" / "versitygw" / "build.sh"
REGION = "us-east-1"
HEALTH = "/health"  # versitygw's unauthenticated health check (--health), answered 200 once it serves
SHA256 = "SHA256"


def versitygw_binary() -> str:
    """The versitygw binary's path: ``deploy/versitygw/build.sh`` builds it on first use, reuses it after."""
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD.relative_to(REPO)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def xattrs_work(directory: Path) -> bool:
    """Whether ``directory``'s filesystem takes user extended attributes (where versitygw keeps its metadata
    unless given a sidecar directory)."""
    probe = directory / ".xattr-probe"
    probe.touch()
    try:
        os.setxattr(probe, "user.gpustack-probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


class S3Server:
    """versitygw on a free loopback port (``url``), its root account's keys ``access_key`` and
    ``secret_key``, in ``region``. ``client()`` makes boto3 clients for it; ``create_bucket`` and ``put``
    are the root's shortcuts. Start with ``start()`` (or ``with S3Server() as s3:``), stop with ``stop()``;
    the process also stops with the process that started it, however that ends."""

    def __init__(self, region: str = REGION):
        self.region = region
        alphabet = string.ascii_uppercase + string.digits
        self.access_key = "GPUSTACK" + "".join(secrets.choice(alphabet) for _ in range(12))  # AKIA…-shaped
        self.secret_key = secrets.token_urlsafe(30)
        self.port = 0
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._root_client = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        binary = versitygw_binary()
        TEST_STATE.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="s3-", dir=TEST_STATE))
        atexit.register(self.stop)  # stopped when the session ends, even without its teardown
        try:
            self._launch(binary)
            wait_for(self._ready, timeout=30, message="versitygw to listen")
        except BaseException:
            self.stop()  # not left running (a session that failed here has no teardown for it)
            raise
        return self

    def argv(self, binary: str) -> list[str]:
        """The command line: the gateway's options, then the posix backend's (buckets are the directories of
        ``data/``, older versions in ``versions/``, metadata in user xattrs or, without them, ``sidecar/``)."""
        dirs = {name: self.root / name for name in ("data", "versions", "iam")}
        for path in dirs.values():
            path.mkdir()
        gateway = ["--port", f"127.0.0.1:{self.port}", "--region", self.region, "--iam-dir", str(dirs["iam"]),
                   "--health", HEALTH, "--keep-alive", "--quiet"]  # fmt: skip
        posix = ["posix", "--versioning-dir", str(dirs["versions"])]
        if not xattrs_work(dirs["data"]):
            (self.root / "sidecar").mkdir()
            posix += ["--sidecar", str(self.root / "sidecar")]
        return [binary, *gateway, *posix, str(dirs["data"])]

    def _launch(self, binary: str) -> None:
        self.port = free_port()
        argv = self.argv(binary)
        # The root's keys in its environment, not on its command line; none of the caller's VGW_/ROOT_/AWS_.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGW_", "ROOT_", "AWS_"))}
        env.update(ROOT_ACCESS_KEY=self.access_key, ROOT_SECRET_KEY=self.secret_key)
        with open(self.root / "versitygw.log", "ab") as log:  # PR_SET_PDEATHSIG: gone with a killed session too
            self.proc = subprocess.Popen(argv, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)  # fmt: skip

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            log = (self.root / "versitygw.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"versitygw exited with {self.proc.returncode}: {log}")
        try:
            with requests.Session() as session:
                session.trust_env = False  # no proxy between the suite and its loopback server
                return session.get(self.url + HEALTH, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        atexit.unregister(self.stop)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._root_client = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- clients

    def client(self, access_key: str | None = None, secret_key: str | None = None, **config):
        """A boto3 S3 client for this server: path-style addressing, SigV4, ``region``; the root's keys unless
        others are given. ``config`` adds or overrides botocore ``Config`` options (retries are off, so a
        refusal is seen at once; loopback connections bypass any proxy of the environment)."""
        options = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"mode": "standard", "max_attempts": 1},
            "proxies": {},  # none: botocore looks at the environment's only when this is None
            "connect_timeout": 5,
            "read_timeout": 60,
        }
        options.update(config)
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(**options),
        )

    @property
    def root_client(self):
        """The root's client, made once (boto3 clients are safe to share between threads)."""
        if self._root_client is None:
            self._root_client = self.client()
        return self._root_client

    def create_bucket(self, name: str, versioned: bool = False) -> str:
        """Create bucket ``name`` (3–63 characters: S3's rules are enforced), with versioning enabled when
        ``versioned``; returns the name."""
        self.root_client.create_bucket(Bucket=name)
        if versioned:
            status = {"Status": "Enabled"}
            self.root_client.put_bucket_versioning(Bucket=name, VersioningConfiguration=status)
        return name

    def put(self, bucket: str, key: str, data: bytes, checksum: bool = True) -> dict:
        """PutObject ``data`` under ``key`` as the root; with ``checksum``, a SHA-256 the server checks and
        keeps (``ChecksumAlgorithm="SHA256"``), without, boto3's default (a CRC32 of its own). Returns the
        response: ``ETag``, ``VersionId`` (versioned buckets), ``ChecksumSHA256``."""
        extra = {"ChecksumAlgorithm": SHA256} if checksum else {}
        return self.root_client.put_object(Bucket=bucket, Key=key, Body=data, **extra)


@pytest.fixture(scope="session")
def s3():
    """The session's S3 server (started on first use). Tests use buckets of their own."""
    with S3Server() as started:
        yield started
