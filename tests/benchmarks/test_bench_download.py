"""The plugin's download (hash-verified and published) against `hf download` and `aria2c -x8` (unverified) of the
same files from the same local hub, unthrottled and with a per-connection throttle (real CDNs give tens of MB/s per
connection)."""

from tests.plugin.bench_download import run


def test_bench_download_throughput(bench_scale, record):
    full = bench_scale == "full"
    result = run([256, 64, 8], 16_000_000, repeat=2, smoke=not full)
    size_mb = result["bytes"] / 1e6
    assert result["bytes"] > 0
    parts = []
    for name in ("unthrottled", "throttled"):
        r = result[name]
        assert len(r["engine_seconds"]) == len(r["hf_seconds"]) == len(r["aria2_seconds"]) == result["repeat"], r
        assert r["aria2_mb_s"] > 0 and r["ratio_vs_aria2"] > 0, r
        if full or r["ratio"] is not None:  # a smoke run's few megabytes may take hf no longer than its start-up
            assert r["ratio"] > 0 and r["hf_mb_s_without_startup"] > 0, r
        else:
            assert min(r["hf_seconds"]) <= result["hf_startup_seconds"], r
        assert r["ratio_vs_hf_wall"] > 0, r
        parts.append(
            f"{name}: plugin {r['engine_mb_s']} MB/s vs hf {r['hf_mb_s_without_startup']} MB/s "
            f"(ratio {r['ratio']}, {r['ratio_vs_hf_wall']} against hf's wall time), aria2c -x8 {r['aria2_mb_s']} MB/s"
            f" (ratio {r['ratio_vs_aria2']}, target >= 1.0)"
        )
        assert r["engine_mb_s"] > 0 and r["hf_mb_s"] > 0
    per_connection = result["per_connection_bps"] / 1e6
    record(
        f"download of {size_mb:.0f} MB: "
        + "; ".join(parts)
        + f" (target ratio >= 1.0; throttled = {per_connection:.0f} MB/s per connection)"
    )
