"""The soak's load and its measurements: API calls at fixed rates, many watches held open, and every role's
processes sampled (resident memory, open files, threads) at a fixed interval.

Each rate is kept by a scheduler thread that submits call ``i`` at ``start + i / rate`` to a pool (at once
when it falls behind: the rate achieved is reported, never assumed). Watches run on one asyncio loop
(aiohttp), each counting the events it reads and reconnecting when the server ends it.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import statistics
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import aiohttp
import psutil


@dataclass
class Calls:
    """Latencies (seconds) and answers of one kind of call."""

    latencies: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # status (0: no answer) -> count
    started: float = 0.0
    ended: float = 0.0

    def add(self, seconds: float, status: int) -> None:
        if 200 <= status < 300:
            self.latencies.append(seconds)
        else:
            self.errors[status] += 1

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

    def rate(self) -> float:
        return (len(self.latencies) + sum(self.errors.values())) / max(1e-9, self.ended - self.started)


class Rated:
    """``call()`` (returning an HTTP status) ``rate`` times a second until stopped, timed into ``calls``."""

    def __init__(self, call, rate: float, calls: Calls, stopping: threading.Event, threads: int = 8):
        self.call, self.rate, self.calls, self.stopping = call, rate, calls, stopping
        self.pool = ThreadPoolExecutor(threads)
        self.submitted, self._begun = 0, itertools.count()
        self.thread = threading.Thread(target=self._schedule, daemon=True)

    def _timed(self):
        next(self._begun)  # itertools.count: one step per call, safe across threads
        started = time.perf_counter()
        try:
            status = self.call()
        except Exception:  # no answer at all (reset, timeout): counted, never raised into the load
            status = 0
        self.calls.add(time.perf_counter() - started, status)

    def _schedule(self):
        self.calls.started = start = time.monotonic()
        i = 0
        while not self.stopping.is_set():
            delay = start + i / self.rate - time.monotonic()
            if delay > 0 and self.stopping.wait(delay):
                break
            self.pool.submit(self._timed)
            self.submitted += 1
            i += 1
        self.calls.ended = time.monotonic()
        # Calls still queued when the run ends were never sent (the service fell behind): dropped, and counted
        # as calls without an answer.
        self.pool.shutdown(wait=True, cancel_futures=True)
        never_sent = self.submitted - next(self._begun)
        if never_sent > 0:
            self.calls.errors[0] += never_sent

    def start(self) -> Rated:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join()


class Watches:
    """``count`` watches of ``url`` held open on one event loop; events read and reconnections counted."""

    def __init__(self, url: str, count: int, ca: str, cert: tuple[str, str]):
        self.url, self.count = url, count
        self.context = ssl.create_default_context(cafile=ca)
        self.context.load_cert_chain(*cert)
        self.events = [0] * count
        self.reconnects = 0
        self.why: dict[str, int] = defaultdict(int)  # failures: "429", "503", "ClientOSError", ... -> count
        self.open_latencies: list[float] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._stop: asyncio.Event | None = None

    async def _one(self, session: aiohttp.ClientSession, index: int):
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                async with session.get(self.url, params={"watch": "1"}, ssl=self.context) as resp:
                    if resp.status != 200:
                        self.why[str(resp.status)] += 1
                        await asyncio.sleep(1)
                        continue
                    self.open_latencies.append(time.perf_counter() - started)
                    async for _line in resp.content:
                        self.events[index] += 1
                        if self._stop.is_set():
                            return
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.why[type(exc).__name__] += 1
                await asyncio.sleep(1)
            self.reconnects += 1

    @property
    def failures(self) -> int:
        """Opens refused or unanswered, and watches broken."""
        return sum(self.why.values())

    async def _main(self, ready: threading.Event):
        self._stop = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:
            tasks = [asyncio.ensure_future(self._one(session, i)) for i in range(self.count)]
            ready.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def start(self) -> Watches:
        self.thread.start()
        ready = threading.Event()
        self.main = asyncio.run_coroutine_threadsafe(self._main(ready), self.loop)
        ready.wait(30)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.main.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


WARM_UP = 0.2  # the first fifth of a run, left out of the memory slopes


@dataclass
class Series:
    """One role's samples: seconds since the start, and resident MB, open files, threads at each."""

    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)  # each sample's resident MB per process id

    def slope(self, warm_up: float = WARM_UP, until: float = 1.0) -> tuple[float, float]:
        """The slope of a line fitted to resident memory, MB per minute, and its standard error; the first
        ``warm_up`` of the run (connections and caches filling as the load starts) left out, and what comes
        after ``until`` (both fractions of the run)."""
        begin, end = (self.seconds[-1] * warm_up, self.seconds[-1] * until) if self.seconds else (0.0, 0.0)
        kept = [(s / 60, rss) for s, rss in zip(self.seconds, self.rss_mb, strict=True) if begin <= s <= end]
        if len(kept) < 3:
            return float("nan"), float("nan")
        minutes, rss_mb = [m for m, _ in kept], [r for _, r in kept]
        fit = statistics.linear_regression(minutes, rss_mb)
        residuals = [y - (fit.slope * x + fit.intercept) for x, y in zip(minutes, rss_mb, strict=True)]
        mean = statistics.fmean(minutes)
        spread = sum((x - mean) ** 2 for x in minutes)
        error = (sum(r * r for r in residuals) / (len(minutes) - 2) / spread) ** 0.5 if spread else float("nan")
        return fit.slope, error


class Sampler:
    """Every ``interval`` seconds: each role's processes (a process and its children, summed)."""

    def __init__(self, roles: dict[str, int], interval: float):
        self.roles = {name: psutil.Process(pid) for name, pid in roles.items()}
        self.series = {name: Series() for name in roles}
        self.interval = interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, started: float) -> None:
        for name, root in self.roles.items():
            rss = fds = threads = 0
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:  # the role is gone: no sample (the load's checks say why)
                continue
            each = {}
            for proc in tree:
                try:
                    with proc.oneshot():
                        each[proc.pid] = proc.memory_info().rss
                        rss, fds, threads = (
                            rss + each[proc.pid],
                            fds + proc.num_fds(),
                            threads + proc.num_threads(),
                        )
                except psutil.NoSuchProcess:
                    continue
            series = self.series[name]
            series.seconds.append(time.monotonic() - started)
            series.rss_mb.append(rss / 1e6)
            series.fds.append(fds)
            series.threads.append(threads)
            series.processes.append({str(pid): round(b / 1e6, 1) for pid, b in each.items()})

    def _run(self) -> None:
        started = time.monotonic()
        while True:
            self._sample(started)
            if self.stopping.wait(self.interval):
                self._sample(started)
                return

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
