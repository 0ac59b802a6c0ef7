"""Runs a command (the test suite) with its own PostgreSQL and Redis, installing them when missing.

    python -m tests.services -- python -m pytest

PostgreSQL and Redis come from Debian's packages (installed with apt-get when their binaries are
absent), run as throw-away servers on free loopback ports for the duration of the command, and are
stopped afterwards whatever the command's outcome. The command sees ``DATABASE_URL`` and
``CELERY_BROKER_URL`` pointing at them. Headless Chromium, for the console's browser tests, is
installed the same way, and so is what the real test node runs (``tests/support/kubelet.py``):
containerd, runc, the CNI plugins, a static busybox and a static C toolchain for its images.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEBIAN_PACKAGES = {"postgres": "postgresql", "redis-server": "redis-server", "chromium": "chromium", "aria2c": "aria2"}
# The real test node: each package and a file that shows it is installed.
NODE_PACKAGES = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "gcc": "/usr/bin/gcc",
    "libc6-dev": "/usr/include/stdio.h",
    # The image: a Debian base assembled by debootstrap, the Dockerfile built by buildah (no registry here).
    "buildah": "/usr/bin/buildah",
    "debootstrap": "/usr/sbin/debootstrap",
    "debian-archive-keyring": "/usr/share/keyrings/debian-archive-keyring.gpg",
    # A real OCI registry (distribution 2.8) with token auth, for the OCI sources (tests/support/registry.py).
    "docker-registry": "/usr/bin/docker-registry",
}


def say(message: str) -> None:
    print(f"[services] {message}", file=sys.stderr, flush=True)


def _sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise SystemExit("installing system packages needs root or password-less sudo")


def apt_install(packages: list[str]) -> None:
    if not packages:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = _sudo() + ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    say(f"installing {' '.join(packages)} from Debian packages")
    if subprocess.run(cmd, env=env).returncode != 0:
        subprocess.run(_sudo() + ["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(cmd, env=env, check=True)


def postgres_bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def deb_installed(package: str) -> bool:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return status.stdout.strip() == "install ok installed"


def node_packages() -> list[str]:
    missing = [package for package, path in NODE_PACKAGES.items() if not Path(path).exists()]
    # busybox-static, not busybox: both provide /bin/busybox, only this one runs in an empty image.
    if not deb_installed("busybox-static"):
        missing.append("busybox-static")
    return missing


def ensure_packages() -> None:
    missing = node_packages()
    if postgres_bindir() is None:
        missing.append(DEBIAN_PACKAGES["postgres"])
    if shutil.which("redis-server") is None:
        missing.append(DEBIAN_PACKAGES["redis-server"])
    if shutil.which("chromium") is None:
        missing.append(DEBIAN_PACKAGES["chromium"])
    if shutil.which("aria2c") is None:  # the download benchmark's anchor: a download accelerator
        missing.append(DEBIAN_PACKAGES["aria2c"])
    apt_install(missing)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{name} did not listen on {port} within {timeout:.0f}s")


class PostgreSQL:
    """A throw-away cluster. initdb refuses root, so as root it runs as the `postgres` system user."""

    def __init__(self):
        self.bindir = postgres_bindir()
        # Under /tmp: the postgres user must be able to reach the data directory.
        self.root = Path(tempfile.mkdtemp(prefix="gpustack-models-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.user = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("postgres")
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _as_owner(self):
        if self.user is None:
            return None
        uid, gid = self.user.pw_uid, self.user.pw_gid

        def demote():
            os.setgid(gid)
            os.setuid(uid)

        return demote

    def start(self) -> str:
        subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            preexec_fn=self._as_owner(),
            cwd=self.root,
        )
        return self.serve()

    def serve(self) -> str:
        """Start the server on the cluster initdb made (again after ``halt``: the same data and port)."""
        log = open(self.root / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.root),
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self._as_owner(),
            cwd=self.root,
        )
        wait_port(self.port, self.proc, "postgres")
        # The server accepts TCP a moment before it accepts logins.
        for _ in range(100):
            ok = (
                subprocess.run(
                    [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                    stdout=subprocess.DEVNULL,
                ).returncode
                == 0
            )
            if ok:
                break
            time.sleep(0.1)
        say(f"PostgreSQL {self.bindir.parent.name} on 127.0.0.1:{self.port}")
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def halt(self) -> None:
        """Stop the server, keeping its data (``serve`` starts it again)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def restart(self) -> str:
        self.halt()
        return self.serve()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--loglevel",
                "warning",
                "--databases",
                "64",  # a few for each of the suite's lanes
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_port(self.port, self.proc, "redis-server")
        say(f"Redis on 127.0.0.1:{self.port}")
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def restart(self) -> str:
        """Stop and start again on the same port (with nothing kept: it persists nothing)."""
        self.stop()
        return self.start()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m tests.services -- COMMAND [ARGS...]")
    ensure_packages()
    postgres, redis = PostgreSQL(), Redis()
    # A stop request still tears the servers down.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        env = dict(os.environ)
        env["DATABASE_URL"] = postgres.start()
        env["CELERY_BROKER_URL"] = redis.start()
        env["GPUSTACK_TEST_DATABASE"] = "postgresql"
        env["GPUSTACK_TEST_BROKER"] = "redis"
        return subprocess.call(argv, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        redis.stop()
        postgres.stop()
        say("stopped PostgreSQL and Redis")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
