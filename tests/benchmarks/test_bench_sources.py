"""The plugin's download (hash-verified and published) from an OCI registry (an artifact, and a model image of
one gzip layer) and from S3, side by side with `oras pull`, `oras blob fetch | tar -xz` and boto3's
`download_file` (what `aws s3 cp` runs) of the same content from the same servers (the
suite's registry and S3 server). Every tool's files are checked byte for byte against the source."""

from tests.plugin.bench_sources import run, summary


def test_bench_source_throughput(registry, s3, bench_scale, record):
    full = bench_scale == "full"
    result = run(registry, s3, repeat=2, smoke=not full)
    assert result["bytes"] > 0 and result["repeat"] == (2 if full else 1)
    protocols = {"oci": ("engine", "oras"), "modelcar": ("engine", "oras_tar"), "s3": ("engine", "boto3", "boto3_8")}
    for protocol, tools in protocols.items():
        r = result[protocol]
        for tool in tools:
            assert len(r[f"{tool}_seconds"]) == result["repeat"], r
            assert r["verified_files"][tool] == r["files"] * result["repeat"], r  # identical to the source
            assert r[f"{tool}_mb_s"] > 0, r
            assert tool == "engine" or r[f"ratio_vs_{tool}"] > 0, r
    record(summary(result))
