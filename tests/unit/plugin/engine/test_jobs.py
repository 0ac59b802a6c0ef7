"""How the end of a download is recorded on its item (the backoff), without running one."""

from __future__ import annotations

from types import SimpleNamespace

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.failures import CANCELED, SOURCE_UNAVAILABLE, DownloadFailed
from gpustack_models.plugin.engine.jobs import Job, Outcomes
from gpustack_models.plugin.engine.records import DOWNLOADING, FAILED, READY, SOURCE_PEER, Records

NOW = 1_700_000_000.0
DIGEST = "sha256:" + "ab" * 32


def ended(downloaded: int, by_source: dict[str, int], *, shutdown: bool = False) -> Job:
    """A job whose download ended with ``downloaded`` bytes (a stand-in: only what is recorded is read)."""
    return Job(SimpleNamespace(downloaded_bytes=downloaded, source_bytes=by_source), shutdown=shutdown)


def test_failures_back_off_doubling_a_cancel_does_not_and_success_forgets_them(tmp_path):
    records = Records(Cache(tmp_path))
    outcomes = Outcomes(records, retry_base=10)
    item, _ = records.claim(DIGEST)
    item.state, item.size = DOWNLOADING, 300

    outcomes.settle(item, ended(100, {"hub": 100}), DownloadFailed(SOURCE_UNAVAILABLE, "HTTP 503"), NOW)
    assert (item.state, item.failures, item.retry_time, item.downloaded) == (FAILED, 1, NOW + 10, 100)
    outcomes.failed(item, DownloadFailed(SOURCE_UNAVAILABLE, "HTTP 503"), NOW)
    assert (item.failures, item.retry_time) == (2, NOW + 20)
    outcomes.failed(item, DownloadFailed(SOURCE_UNAVAILABLE, "HTTP 429", retry_after=300), NOW)
    assert (item.failures, item.retry_time) == (3, NOW + 300)  # never before the hub's hint
    outcomes.failed(item, DownloadFailed(CANCELED, "cancelled"), NOW)
    assert (item.reason, item.failures, item.retry_time) == (CANCELED, 3, None)
    assert records.cache.load_record(DIGEST)["failures"] == 3

    outcomes.settle(item, ended(120, {"hub": 20, "node-b": 100}), None, NOW + 5)
    assert (item.state, item.downloaded, item.source, item.last_used) == (READY, 300, SOURCE_PEER, NOW + 5)
    assert (item.failures, item.reason, item.message, item.retry_time) == (0, None, None, None)
    assert records.cache.load_record(DIGEST)["state"] == READY


def test_a_download_stopped_for_good_stays_downloading_with_its_partial_work_counted(tmp_path):
    records = Records(Cache(tmp_path))
    item, _ = records.claim(DIGEST)
    item.state, item.size = DOWNLOADING, 300
    (records.cache.partial_tree(DIGEST)).mkdir(parents=True)
    (records.cache.partial_tree(DIGEST) / "model.bin").write_bytes(b"x" * 8192)

    stopped = ended(150, {"hub": 150}, shutdown=True)
    Outcomes(records, retry_base=10).settle(item, stopped, DownloadFailed(CANCELED, "stopping"), NOW)

    assert (item.state, item.downloaded, item.failures) == (DOWNLOADING, 150, 0)
    assert records.cache.load_record(DIGEST)["downloadedBytes"] == 150
    assert records.idle_partial == {DIGEST: records.cache.partial_bytes(DIGEST)}


def test_the_live_rate_is_measured_over_the_last_ten_seconds_of_received_bytes():
    from gpustack_models.plugin.engine.jobs import Rate

    now = [100.0]
    rate = Rate(clock=lambda: now[0])
    assert rate(0) == 0  # the first ask takes a sample: bytes already there are no speed
    now[0] += 2
    assert rate(4_000_000) == 2_000_000  # since the start
    now[0] += 8
    assert rate(4_000_000) == 400_000  # 4 MB over the 10 s since the start
    now[0] += 10
    assert rate(4_000_000) == 0  # nothing received over the last 10 s
    now[0] += 5
    assert rate(9_000_000) == 333_333  # 5 MB since the last sample at least 10 s old (15 s)
