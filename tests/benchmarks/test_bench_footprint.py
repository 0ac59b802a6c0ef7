"""How much memory a node plugin holds, idle and while it downloads 8 files at once, beside the API's worker
processes at the same moments (resident set sizes by psutil, sampled every 20 ms; targets: at most 100 MB
idle and 150 MB downloading, the plugin being on every GPU node)."""

import hashlib
import threading
import time

import psutil

MB = 1_000_000
SAMPLE_SECONDS = 0.02
IDLE_SECONDS = 3.0


class PeakRSS:
    """The largest resident set size of each process while the block runs (bytes)."""

    def __init__(self, pids: list[int]):
        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.peak = dict.fromkeys(pids, 0)
        self.samples = 0
        self._done = threading.Event()

    def _run(self):
        while True:
            for pid, proc in self.procs.items():
                self.peak[pid] = max(self.peak[pid], proc.memory_info().rss)
            self.samples += 1
            if self._done.wait(SAMPLE_SECONDS):
                return

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def eight_files(seed: str, mb: int) -> dict[str, bytes]:
    files = {"config.json": b'{"model": "%s"}' % seed.encode()}
    for i in range(8):
        block = hashlib.sha256(f"{seed}-{i}".encode()).digest() * 32768  # 1 MiB
        files[f"model-{i + 1:05d}-of-00008.safetensors"] = block * mb
    return files


def test_bench_plugin_memory(bench_scale, record, scenario, hub, worker_api):
    full = bench_scale == "full"
    mb = 32 if full else 2
    scenario.artifact(files=eight_files(scenario.repo, mb))
    (plugin,) = scenario.plugins(1)
    api_workers = [p.pid for p in psutil.Process(worker_api.proc.pid).children()]
    assert api_workers
    pids = [plugin.proc.pid, *api_workers]
    with PeakRSS(pids) as idle:
        time.sleep(IDLE_SECONDS if full else 0.5)  # the window measured idle (nothing to wait for)
    # 16 MB/s per connection: the 8 files are in flight together for a few seconds, not a fraction of one.
    hub.faults.throttle(None, 16 * MB if full else 4 * MB, times=None)
    with PeakRSS(pids) as busy:
        scenario.prefetch([plugin])
        scenario.wait_state(plugin.node, "Ready", timeout=300)
    assert idle.samples > 0 and busy.samples > 1
    api_idle = max(idle.peak[pid] for pid in api_workers) / MB
    api_busy = max(busy.peak[pid] for pid in api_workers) / MB
    record(
        f"plugin process RSS: idle {idle.peak[plugin.proc.pid] / MB:.0f} MB (target <= 100), downloading 8 files"
        f" of {mb} MiB at once {busy.peak[plugin.proc.pid] / MB:.0f} MB peak (target <= 150); an API worker at"
        f" the same moments: {api_idle:.0f} / {api_busy:.0f} MB"
    )
