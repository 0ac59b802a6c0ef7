"""A plugin's peer endpoints serving a Ready tree over TLS, read by curl (a client that is not the bottleneck):
the big file over one connection and as four parallel ranges, beside ``openssl s_server -WWW`` serving the same
file with the same certificate to the same client (the C library's own loop: what this machine's TLS can do),
and the fake hub over plain HTTP."""

import os
import resource
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from gpustack_models.plugin.peers.contract import file_url
from tests.support.plugins import client_cert
from tests.support.waiting import wait_for
from tests.test_peers import WEIGHTS
from tests.test_plugins import big_files


def curl(url: str, tls: list[str], byte_range: str | None = None) -> int:
    """The bytes curl read from ``url`` (thrown away as they come: its rate is the server's)."""
    args = ["curl", "-sS", "--fail", "--noproxy", "*", "-o", "/dev/null", "-w", "%{size_download}", *tls, url]
    if byte_range:
        args[1:1] = ["-r", byte_range]
    return int(subprocess.run(args, check=True, capture_output=True, text=True, timeout=300).stdout)


def read_ranges(url: str, tls: list[str], size: int, connections: int) -> float:
    """MB/s reading ``size`` bytes as ``connections`` ranges at once, each by its own curl (one: the whole
    file, no range asked)."""
    step = -(-size // connections)
    spans = [(s, min(size, s + step)) for s in range(0, size, step)]
    started = time.monotonic()
    with ThreadPoolExecutor(connections) as pool:
        ranges = [f"{start}-{end - 1}" if connections > 1 else None for start, end in spans]
        got = list(pool.map(lambda byte_range: curl(url, tls, byte_range), ranges))
    elapsed = time.monotonic() - started
    assert got == [end - start for start, end in spans], got
    return size / elapsed / 1e6


def best(runs: int, measure) -> float:
    """The best of ``runs`` measurements (the machine's other work only ever slows one down)."""
    return max(measure() for _ in range(runs))


def cores_busy(server_pid: int, measure) -> tuple[float, float]:
    """How many cores one ``measure()`` kept busy: the server process's CPU time and the clients' (curl, this
    process's children), each over the wall time."""
    server = psutil.Process(server_pid)

    def cpu():
        own = server.cpu_times()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.user + own.system, children.ru_utime + children.ru_stime

    (server0, client0), started = cpu(), time.monotonic()
    measure()
    (server1, client1), wall = cpu(), time.monotonic() - started
    return (server1 - server0) / wall, (client1 - client0) / wall


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s_server(tree: Path, serving: Path, port: int) -> subprocess.Popen:
    """``openssl s_server -WWW`` serving the files of ``tree`` with the plugin's own serving certificate."""
    args = ["openssl", "s_server", "-WWW", "-quiet", "-accept", f"127.0.0.1:{port}"]
    args += ["-cert", str(serving / "serving.crt"), "-key", str(serving / "serving.key")]
    devnull = subprocess.DEVNULL
    proc = subprocess.Popen(args, cwd=tree, stdin=devnull, stdout=devnull, stderr=devnull)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_for(listening, timeout=10, message="openssl s_server listening")
    return proc


def test_bench_peer_serving(bench_scale, record, profiled, scenario, hub, launcher):
    mb, runs = (256, 3) if bench_scale == "full" else (3, 1)
    scenario.artifact(files=big_files(scenario.repo, mb=mb))
    a, b = scenario.plugins(2)
    scenario.prefetch([a, b])
    scenario.wait_state(a.node, "Ready", timeout=300)
    scenario.wait_state(b.node, "Ready", timeout=300)
    size = len(scenario.files[WEIGHTS])
    certificate, key = client_cert(b)
    ca = launcher.data_dir / "plugin-pki" / "ca.crt"
    tls = ["--cacert", str(ca), "--cert", certificate, "--key", key]
    url = file_url(a.peer_url, scenario.digest, WEIGHTS)
    assert curl(url, tls) == size  # warm: the file in the page cache, as a Ready tree read by peers is
    with profiled(a.proc.pid, "peer-serving-one-connection"):
        one = best(runs, lambda: read_ranges(url, tls, size, 1))
    four = best(runs, lambda: read_ranges(url, tls, size, 4))
    server_cores, client_cores = cores_busy(a.proc.pid, lambda: read_ranges(url, tls, size, 1))
    busy_four = sum(cores_busy(a.proc.pid, lambda: read_ranges(url, tls, size, 4)))

    tree = a.cache / "models" / scenario.digest.removeprefix("sha256:")
    assert (tree / WEIGHTS).stat().st_size == size
    port = free_port()
    anchor = s_server(tree, Path(a.env["GPUSTACK_DATA_DIR"]) / "plugin" / a.node / "serving-tls", port)
    try:
        openssl = best(runs, lambda: read_ranges(f"https://127.0.0.1:{port}/{WEIGHTS}", ["-k"], size, 1))
    finally:
        anchor.kill()
        anchor.wait(10)
    hub_mb_s = best(runs, lambda: read_ranges(f"{hub.url}/{scenario.repo}/resolve/main/{WEIGHTS}", ["-L"], size, 1))
    assert one > 0 and four > 0 and openssl > 0 and hub_mb_s > 0
    record(
        f"peer serving of a {size / 1e6:.0f} MB file (TLS, read by curl): one connection {one:.1f} MB/s"
        f" ({one / openssl:.2f}x openssl s_server -WWW's {openssl:.1f} MB/s), four ranges {four:.1f} MB/s"
        f" ({four / one:.2f}x one); the fake hub over plain HTTP {hub_mb_s:.1f} MB/s; one connection keeps"
        f" {server_cores + client_cores:.2f} of {os.cpu_count()} cores busy (server {server_cores:.2f},"
        f" curl {client_cores:.2f}), four ranges {busy_four:.2f}: ranges scale only where cores are left"
    )
