"""The fake hub, checked with the real huggingface_hub and modelscope clients (and plain requests)."""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import urllib3

from tests.fakehub import FakeHub, git_blob_sha1, lfs_pointer

PYTHON_BIN = Path(sys.executable).parent


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def http() -> requests.Session:
    """A plain client that ignores proxy and CA variables (loopback only)."""
    session = requests.Session()
    session.trust_env = False
    return session


def hf_api(hub, token=False):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=token)


def sample_files():
    return {
        "config.json": b'{"model_type": "llama"}',
        "tokenizer/tokenizer.json": b'{"vocab": {}}',
        "model-00001-of-00002.safetensors": blob(5000, 1),
        "model-00002-of-00002.safetensors": blob(3000, 2),
        "original/consolidated.pth": blob(2048, 3),
    }


# --------------------------------------------------------------------------------------------------
# Hugging Face
# --------------------------------------------------------------------------------------------------


def test_it_resolves_branches_tags_and_commits(fakehub):
    first = fakehub.add_hf_repo("org/model", sample_files(), tags=("v1",))
    second = fakehub.add_hf_commit("org/model", {"config.json": b'{"model_type": "qwen"}'})
    pr = fakehub.add_hf_commit("org/model", {"extra.txt": b"pr"}, branch="refs/pr/1", parent=first)
    api = hf_api(fakehub)

    assert api.model_info("org/model").sha == second
    assert api.model_info("org/model", revision="main").sha == second
    assert api.model_info("org/model", revision="v1").sha == first
    assert api.model_info("org/model", revision=first).sha == first
    assert api.model_info("org/model", revision="refs/pr/1").sha == pr
    refs = api.list_repo_refs("org/model")
    assert {b.name: b.target_commit for b in refs.branches} == {"main": second, "refs/pr/1": pr}
    assert {t.name: t.target_commit for t in refs.tags} == {"v1": first}


def test_it_keeps_old_commits_readable(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download

    old = fakehub.add_hf_repo("org/model", {"config.json": b"old", "gone.txt": b"bye"})
    new = fakehub.add_hf_commit("org/model", {"config.json": b"new", "gone.txt": None})

    assert fakehub.files("org/model", old) == {"config.json": b"old", "gone.txt": b"bye"}
    assert fakehub.files("org/model") == {"config.json": b"new"}
    get = lambda rev: Path(  # noqa: E731
        hf_hub_download("org/model", "config.json", revision=rev, endpoint=fakehub.url, cache_dir=tmp_path)
    ).read_bytes()
    assert get(old) == b"old"
    assert get(new) == b"new"
    assert get("main") == b"new"
    assert [f.path for f in hf_api(fakehub).list_repo_tree("org/model", revision=old)] == ["config.json", "gone.txt"]


def test_it_lists_a_tree_across_several_pages(fakehub):
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    files = {f"shards/part-{i:02d}.bin": blob(100 + i, i) for i in range(7)}
    files.update({"config.json": b"{}", "big.safetensors": blob(4096, 99), "a/b/c.txt": b"deep"})
    commit = fakehub.add_hf_repo("org/paged", files)
    fakehub.page_size = 3
    api = hf_api(fakehub)

    entries = list(api.list_repo_tree("org/paged", recursive=True, revision=commit))
    assert sorted(e.path for e in entries if isinstance(e, RepoFile)) == sorted(files)
    assert sorted(e.path for e in entries if isinstance(e, RepoFolder)) == ["a", "a/b", "shards"]
    pages = fakehub.requests_matching("/tree/")
    assert len(pages) == 5  # 13 entries, 3 per page
    assert all("cursor" in p.query for p in pages[1:])

    by_path = {e.path: e for e in entries}
    small, big = by_path["config.json"], by_path["big.safetensors"]
    assert small.blob_id == git_blob_sha1(b"{}") and small.lfs is None and small.size == 2
    assert big.lfs.sha256 == hashlib.sha256(files["big.safetensors"]).hexdigest()
    assert big.lfs.size == big.size == 4096
    pointer = lfs_pointer(big.lfs.sha256, 4096)
    assert big.blob_id == git_blob_sha1(pointer) and big.lfs.pointer_size == len(pointer)

    shallow = list(api.list_repo_tree("org/paged", "a", revision="main"))
    assert [(type(e).__name__, e.path) for e in shallow] == [("RepoFolder", "a/b")]
    expanded = list(api.list_repo_tree("org/paged", "shards", revision="main", expand=True))
    assert all(e.last_commit.oid == commit for e in expanded)


def test_it_serves_files_byte_for_byte_with_lfs_through_the_cdn(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download

    files = sample_files()
    fakehub.add_hf_repo("org/model", files)
    for path, data in files.items():
        local = hf_hub_download("org/model", path, endpoint=fakehub.url, cache_dir=tmp_path)
        assert Path(local).read_bytes() == data

    lfs = fakehub.requests_matching("model-00001-of-00002.safetensors")
    assert [(r.listener, r.method, r.status) for r in lfs] == [("hub", "HEAD", 302), ("cdn", "GET", 200)]
    assert urlsplit(fakehub.cdn_url).netloc != urlsplit(fakehub.url).netloc  # another origin
    assert lfs[1].token is None  # no credentials leave the hub
    small = fakehub.requests_matching("config.json")
    assert [(r.listener, r.method, r.status, r.bytes_sent) for r in small] == [
        ("hub", "HEAD", 200, 0),
        ("hub", "GET", 200, len(files["config.json"])),
    ]


def test_it_answers_heads_and_ranges_like_the_hub(fakehub):
    data = blob(5000, 7)
    commit = fakehub.add_hf_repo("org/model", {"w.safetensors": data, "small.txt": b"0123456789" * 10})
    s = http()

    head = s.head(f"{fakehub.url}/org/model/resolve/main/w.safetensors", allow_redirects=False)
    assert head.status_code == 302
    assert head.headers["X-Repo-Commit"] == commit
    assert head.headers["X-Linked-Etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert head.headers["X-Linked-Size"] == "5000"
    assert head.headers["Location"].startswith(fakehub.cdn_url)

    cdn = head.headers["Location"]
    part = s.get(cdn, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["Content-Range"] == "bytes 100-199/5000"
    assert s.get(cdn, headers={"Range": "bytes=4990-"}).content == data[4990:]
    assert s.get(cdn, headers={"Range": "bytes=-10"}).content == data[-10:]
    bad = s.get(cdn, headers={"Range": "bytes=5000-"})
    assert bad.status_code == 416 and bad.headers["Content-Range"] == "bytes */5000"
    forged = re.sub(r"Signature=\w+", "Signature=00", cdn)
    assert s.get(forged).status_code == 403

    small = s.get(f"{fakehub.url}/org/model/resolve/{commit}/small.txt", headers={"Range": "bytes=5-14"})
    assert small.status_code == 206 and small.content == b"5678901234"
    assert small.headers["ETag"] == f'"{git_blob_sha1(b"0123456789" * 10)}"'

    log = fakehub.requests_matching("small.txt")[-1]
    assert (log.method, log.range, log.status, log.bytes_sent) == ("GET", "bytes=5-14", 206, 10)


def test_it_serves_xet_backed_files_like_the_hub(fakehub, tmp_path):
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.hf_api import RepoFile

    files = sample_files()
    commit = fakehub.add_hf_repo("org/xet", files, xet=True)
    fakehub.add_hf_repo("org/lfs", files)
    api = hf_api(fakehub)

    entries = {e.path: e for e in api.list_repo_tree("org/xet", recursive=True) if isinstance(e, RepoFile)}
    classic = {e.path: e for e in api.list_repo_tree("org/lfs", recursive=True) if isinstance(e, RepoFile)}
    for path, data in files.items():
        entry, ref = entries[path], fakehub.file_info("org/xet", path)
        if len(data) < fakehub.lfs_threshold:  # a plain git blob, as in any repository
            assert entry.xet_hash is None and entry.lfs is None and not ref.xet
            continue
        # An LFS file to git (same oid and lfs object as in classic LFS), its content in Xet storage.
        assert ref.xet and re.fullmatch(r"[0-9a-f]{64}", entry.xet_hash) and entry.xet_hash == ref.xet_hash
        assert entry.xet_hash != hashlib.sha256(data).hexdigest()
        assert entry.lfs == classic[path].lfs and entry.blob_id == classic[path].blob_id
        assert entry.lfs.sha256 == hashlib.sha256(data).hexdigest() and entry.size == len(data)

    big = "model-00001-of-00002.safetensors"
    meta = get_hf_file_metadata(hf_hub_url("org/xet", big, endpoint=fakehub.url), token=False)
    assert meta.xet_file_data.file_hash == entries[big].xet_hash
    assert meta.xet_file_data.refresh_route == f"{fakehub.url}/api/models/org/xet/xet-read-token/{commit}"
    assert (meta.commit_hash, meta.etag, meta.size) == (commit, entries[big].lfs.sha256, len(files[big]))
    assert meta.location.startswith(fakehub.cdn_url)

    # Without Xet transfers (the hub_env fixture), the client downloads through the redirect.
    assert Path(hf_hub_download("org/xet", big, endpoint=fakehub.url, cache_dir=tmp_path)).read_bytes() == files[big]
    # So does a range downloader: the CDN honours Range.
    part = http().get(f"{fakehub.url}/org/xet/resolve/{commit}/{big}", headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == files[big][10:20]
    assert part.history[0].status_code == 302 and part.history[0].headers["X-Xet-Hash"] == entries[big].xet_hash
    assert part.url.startswith(fakehub.cdn_url)

    # A hub (or mirror) that lists Xet files without their lfs object.
    fakehub.xet_lfs_info = False
    bare = {e.path: e for e in api.list_repo_tree("org/xet", recursive=True) if isinstance(e, RepoFile)}
    assert bare[big].lfs is None and bare[big].xet_hash == entries[big].xet_hash
    relisted = {e.path: e for e in api.list_repo_tree("org/lfs", recursive=True) if isinstance(e, RepoFile)}
    assert relisted[big].lfs == classic[big].lfs  # classic LFS files keep theirs


def test_it_serves_files_from_disk(fakehub, tmp_path):
    from huggingface_hub import snapshot_download

    weights = tmp_path / "weights.bin"
    weights.write_bytes(blob(3 * 1024 * 1024, 8))
    fakehub.add_hf_repo("org/disk", {"model.safetensors": weights, "config.json": b"{}"})
    info = fakehub.file_info("org/disk", "model.safetensors")
    assert info.lfs and info.blob.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    root = Path(snapshot_download("org/disk", endpoint=fakehub.url, cache_dir=tmp_path / "cache"))
    assert (root / "model.safetensors").read_bytes() == weights.read_bytes()
    (cdn_get,) = fakehub.requests_matching("model.safetensors", method="GET")
    assert cdn_get.listener == "cdn"
    part = http().get(fakehub.cdn_url + cdn_get.target, headers={"Range": "bytes=1048576-1048580"})
    assert part.status_code == 206 and part.content == weights.read_bytes()[1048576:1048581]


def test_it_keeps_connections_alive(fakehub):
    fakehub.add_hf_repo("org/model", {"a.txt": b"a", "b.txt": b"b"})
    s = http()
    assert s.get(f"{fakehub.url}/org/model/resolve/main/a.txt").content == b"a"
    assert s.get(f"{fakehub.url}/org/model/resolve/main/b.txt").content == b"b"
    first, second = fakehub.requests
    assert first.client == second.client  # same client port: one connection


def test_it_hides_private_repositories_from_other_tokens(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    fakehub.add_hf_repo("org/private", {"config.json": b"{}"}, private=True, token="hf_owner")
    fakehub.add_token("hf_stranger")

    with pytest.raises(RepositoryNotFoundError) as anonymous:
        hf_api(fakehub).model_info("org/private")
    assert anonymous.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError) as stranger:
        hf_api(fakehub, "hf_stranger").model_info("org/private")
    assert stranger.value.response.status_code == 404
    with pytest.raises(HfHubHTTPError) as invalid:
        hf_api(fakehub, "hf_forged").model_info("org/private")
    assert invalid.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        hf_api(fakehub).model_info("org/never-created")

    assert hf_api(fakehub, "hf_owner").model_info("org/private").private is True
    local = hf_hub_download("org/private", "config.json", endpoint=fakehub.url, cache_dir=tmp_path, token="hf_owner")
    assert Path(local).read_bytes() == b"{}"
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/private", "config.json", endpoint=fakehub.url, cache_dir=tmp_path / "x", token=False)


def test_it_gates_downloads_but_not_listings(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError

    fakehub.add_hf_repo("org/gated", {"config.json": b"{}", "w.safetensors": blob(2048)}, gated=True)
    fakehub.add_token("hf_user")
    info = hf_api(fakehub).model_info("org/gated")
    assert info.gated == "manual" and info.private is False
    assert {f.path for f in hf_api(fakehub).list_repo_tree("org/gated")} == {"config.json", "w.safetensors"}

    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download("org/gated", "config.json", endpoint=fakehub.url, cache_dir=tmp_path, token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as ungranted:
        hf_api(fakehub, "hf_user").auth_check("org/gated")
    assert ungranted.value.response.status_code == 403

    fakehub.grant("org/gated", "hf_user")
    hf_api(fakehub, "hf_user").auth_check("org/gated")
    local = hf_hub_download("org/gated", "w.safetensors", endpoint=fakehub.url, cache_dir=tmp_path, token="hf_user")
    assert Path(local).read_bytes() == blob(2048)


def test_it_reports_unknown_revisions_and_entries(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RevisionNotFoundError

    commit = fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    with pytest.raises(RevisionNotFoundError):
        hf_api(fakehub).model_info("org/model", revision="nope")
    with pytest.raises(RevisionNotFoundError):
        hf_api(fakehub).model_info("org/model", revision="0" * 40)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/model", "missing.bin", endpoint=fakehub.url, cache_dir=tmp_path)
    answer = http().head(f"{fakehub.url}/org/model/resolve/main/missing.bin")
    assert answer.headers["X-Error-Code"] == "EntryNotFound" and answer.headers["X-Repo-Commit"] == commit


def test_it_snapshot_downloads_with_huggingface_hub_and_the_hf_cli(fakehub, tmp_path):
    from huggingface_hub import snapshot_download

    files = sample_files()
    commit = fakehub.add_hf_repo("org/model", files, tags=("v1",))
    fakehub.page_size = 2
    root = Path(snapshot_download("org/model", revision="v1", endpoint=fakehub.url, cache_dir=tmp_path / "cache"))
    assert root.name == commit
    assert {p: (root / p).read_bytes() for p in files} == files
    only = Path(
        snapshot_download(
            "org/model",
            endpoint=fakehub.url,
            cache_dir=tmp_path / "cache2",
            allow_patterns=["*.json"],
            ignore_patterns=["tokenizer/"],
        )
    )
    assert sorted(str(p.relative_to(only)) for p in only.rglob("*") if p.is_file()) == ["config.json"]

    env = dict(os.environ, HF_ENDPOINT=fakehub.url)
    out = tmp_path / "cli"
    proc = subprocess.run(
        [str(PYTHON_BIN / "hf"), "download", "org/model", "--revision", "main", "--local-dir", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert {p: (out / p).read_bytes() for p in files} == files


# --------------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------------


def test_it_fails_matching_requests_a_limited_number_of_times(fakehub):
    fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    fault = fakehub.faults.fail("/tree/", 503, times=1)
    entries = list(hf_api(fakehub).list_repo_tree("org/model"))  # the client retries once, after 1 s
    assert [e.path for e in entries] == ["config.json"] and fault.hits == 1 and fault.exhausted
    failed, retried = fakehub.requests_matching("/tree/")
    assert [(r.status, r.fault) for r in (failed, retried)] == [(503, "fail"), (200, None)]
    assert retried.started - (failed.started + failed.duration) >= 1  # as the hub saw them

    fakehub.faults.fail("config.json", 429, retry_after=7, times=2, method="GET")
    s = http()
    assert s.head(f"{fakehub.url}/org/model/resolve/main/config.json").status_code == 200  # method filter
    limited = s.get(f"{fakehub.url}/org/model/resolve/main/config.json")
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "7"
    assert s.get(f"{fakehub.url}/org/model/resolve/main/config.json").status_code == 429
    assert s.get(f"{fakehub.url}/org/model/resolve/main/config.json").content == b"{}"

    fakehub.faults.fail(re.compile(r"/api/models/org/model$"), 500, times=None)
    for _ in range(3):
        assert s.get(f"{fakehub.url}/api/models/org/model").status_code == 500
    fakehub.faults.clear()
    assert s.get(f"{fakehub.url}/api/models/org/model").status_code == 200


def test_it_drops_a_download_mid_file_and_the_client_resumes(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download

    mib = 1024 * 1024
    data = blob(24 * mib, 5)
    fakehub.add_hf_repo("org/model", {"model.safetensors": data, "small.safetensors": data[:300_000]})
    fakehub.faults.drop("model.safetensors", after_bytes=15 * mib, times=1)
    local = hf_hub_download("org/model", "model.safetensors", endpoint=fakehub.url, cache_dir=tmp_path)
    assert Path(local).read_bytes() == data
    gets = fakehub.requests_matching("model.safetensors", method="GET")
    # huggingface_hub writes (and so resumes) in 10 MiB chunks: the 5 MiB after that are fetched again.
    assert [(r.listener, r.status, r.range, r.bytes_sent, r.fault) for r in gets] == [
        ("cdn", 200, None, 15 * mib, "drop"),
        ("cdn", 206, f"bytes={10 * mib}-", 14 * mib, None),
    ]

    fakehub.faults.drop("small.safetensors", after_bytes=100_000, times=1)
    local = hf_hub_download("org/model", "small.safetensors", endpoint=fakehub.url, cache_dir=tmp_path)
    assert Path(local).read_bytes() == data[:300_000]
    gets = fakehub.requests_matching("small.safetensors", method="GET")
    assert [(r.status, r.range, r.bytes_sent) for r in gets] == [(200, None, 100_000), (200, None, 300_000)]


def test_it_throttles_file_bodies_per_connection(fakehub):
    fakehub.lfs_threshold = 10**9  # served by the hub itself, no redirect
    fakehub.add_hf_repo("org/model", {"slow.bin": b"s" * 60_000, "fast.bin": b"f" * 60_000})
    fakehub.faults.throttle("slow.bin", bytes_per_second=40_000)
    s = http()
    started = time.monotonic()
    assert s.get(f"{fakehub.url}/org/model/resolve/main/fast.bin").content == b"f" * 60_000
    fast = time.monotonic() - started
    started = time.monotonic()
    assert s.get(f"{fakehub.url}/org/model/resolve/main/slow.bin").content == b"s" * 60_000
    slow = time.monotonic() - started
    assert slow >= 1.3 and fast < 1.0
    assert [r.fault for r in fakehub.requests_matching(".bin")] == [None, "throttle"]


def test_it_pauses_bodies_mid_file_until_released(fakehub):
    fakehub.lfs_threshold = 10**9  # served by the hub itself, no redirect
    data = blob(600_000, 7)
    fakehub.add_hf_repo("org/model", {"w.bin": data, "other.bin": data[:1000]})
    url = f"{fakehub.url}/org/model/resolve/main/w.bin"
    first = fakehub.faults.pause("w.bin", after_bytes=100_000)
    second = fakehub.faults.pause("w.bin", after_bytes=400_000)
    s = http()
    with s.get(url, stream=True) as held:
        assert held.status_code == 200 and held.headers["Content-Length"] == str(len(data))
        assert held.raw.read(100_000) == data[:100_000]
        assert first.wait_held(timeout=10) == 1
        (record,) = fakehub.requests_matching("w.bin")
        assert (record.bytes_sent, record.fault, second.held) == (100_000, "pause", 0)
        assert s.get(f"{fakehub.url}/org/model/resolve/main/other.bin").content == data[:1000]  # others go on
        first.release()
        assert second.wait_held(timeout=10) == 1 and first.held == 0
        assert record.bytes_sent == 400_000
        assert held.raw.read(300_000) == data[100_000:400_000]
        second.release()
        assert held.raw.read() == data[400_000:]
    assert (first.hits, second.hits, first.held, second.held) == (1, 1, 0, 0)
    assert s.get(url).content == data  # a released pause matches nothing more
    assert [r.fault for r in fakehub.requests_matching("w.bin")] == ["pause", None]

    # Each body on its own: a range is held ``after_bytes`` into it, two at once until the one release.
    ranges = fakehub.faults.pause("w.bin", after_bytes=50_000)
    with (
        s.get(url, headers={"Range": "bytes=100000-"}, stream=True) as one,
        s.get(url, headers={"Range": "bytes=300000-399999"}, stream=True) as two,
    ):
        assert ranges.wait_held(2, timeout=10) == 2
        sent = {r.range: r.bytes_sent for r in fakehub.requests_matching("w.bin")[-2:]}
        assert sent == {"bytes=100000-": 50_000, "bytes=300000-399999": 50_000}
        ranges.release()
        assert one.raw.read() == data[100_000:] and two.raw.read() == data[300_000:400_000]

    # For a bounded time: the body goes on by itself.
    fakehub.faults.pause("w.bin", after_bytes=0, seconds=0.3, times=1)
    assert s.get(url).content == data
    bounded = fakehub.requests_matching("w.bin")[-1]
    assert bounded.fault == "pause" and bounded.duration >= 0.3

    # Clearing the faults lets a held body go on; a pause that a drop comes before never holds.
    fault = fakehub.faults.pause("w.bin", after_bytes=1000)
    with s.get(url, stream=True) as held:
        fault.wait_held(timeout=10)
        fakehub.faults.clear()
        assert held.raw.read() == data
    fakehub.faults.drop("w.bin", after_bytes=5000)
    later = fakehub.faults.pause("w.bin", after_bytes=6000)
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        s.get(url)
    assert (later.hits, later.held, fakehub.requests_matching("w.bin")[-1].bytes_sent) == (1, 0, 5000)


def test_a_stopping_hub_releases_its_pauses_and_a_released_throttle_goes_full_speed():
    data = blob(200_000, 8)
    with FakeHub() as hub:
        hub.lfs_threshold = 10**9
        hub.add_hf_repo("org/model", {"w.bin": data})
        url = f"{hub.url}/org/model/resolve/main/w.bin"
        throttle = hub.faults.throttle("w.bin", bytes_per_second=20_000)  # 10 s for the whole body
        pause = hub.faults.pause("w.bin", after_bytes=10_000)
        with http().get(url, stream=True) as held:
            assert held.raw.read(10_000) == data[:10_000]
            pause.wait_held(timeout=10)
            throttle.release()
            pause.release()
            released = time.monotonic()
            assert held.raw.read() == data[10_000:]
            rest = time.monotonic() - released
        assert rest < (len(data) - 10_000) / 20_000 / 2, rest  # throttled, the rest alone takes about 9.5 s
        assert [r.fault for r in hub.requests_matching("w.bin")] == ["throttle,pause"]
        stuck = hub.faults.pause("w.bin", after_bytes=1000)
        with http().get(url, stream=True) as held:
            stuck.wait_held(timeout=10)
            hub.stop()
            assert stuck.released.is_set()
            with pytest.raises(urllib3.exceptions.ProtocolError):  # the body ends where the hub stopped
                held.raw.read()


def test_it_corrupts_one_byte_once(fakehub, tmp_path):
    from huggingface_hub import hf_hub_download

    data = blob(4000, 11)
    fakehub.add_hf_repo("org/model", {"w.safetensors": data, "x.safetensors": data[::-1]})
    fakehub.faults.corrupt("w.safetensors", times=1)
    s = http()
    location = s.head(f"{fakehub.url}/org/model/resolve/main/w.safetensors").headers["Location"]
    bad = s.get(location).content
    assert len(bad) == len(data)
    assert [i for i in range(len(data)) if bad[i] != data[i]] == [2000]
    assert s.get(location).content == data

    # huggingface_hub does not verify what it downloads: the corrupted bytes land in its cache.
    fakehub.faults.corrupt("x.safetensors", offset=0)
    local = Path(hf_hub_download("org/model", "x.safetensors", endpoint=fakehub.url, cache_dir=tmp_path))
    assert local.read_bytes() != data[::-1] and local.read_bytes()[1:] == data[::-1][1:]


def test_it_hangs_until_the_client_gives_up(fakehub):
    import httpx2

    fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    fakehub.faults.hang("config.json", times=1)
    s = http()
    with pytest.raises(requests.exceptions.ReadTimeout):
        s.get(f"{fakehub.url}/org/model/resolve/main/config.json", timeout=0.5)
    (hung,) = fakehub.requests_matching("config.json")
    assert (hung.fault, hung.status, hung.duration) == ("hang", 0, 0.0)  # still hanging when the client gave up
    assert http().get(f"{fakehub.url}/org/model/resolve/main/config.json", timeout=5).content == b"{}"

    fakehub.faults.hang(re.compile(r"/api/models/"), seconds=1.0)
    with pytest.raises(httpx2.ReadTimeout):
        hf_api(fakehub).model_info("org/model", timeout=0.3)  # model_info does not retry


def test_it_logs_every_request(fakehub):
    fakehub.add_hf_repo("org/model", {"config.json": b"{}"}, private=True, token="hf_t")
    s = http()
    headers = {"Authorization": "Bearer hf_t", "Range": "bytes=0-0"}
    s.get(f"{fakehub.url}/org/model/resolve/main/config.json?download=true", headers=headers)
    (r,) = fakehub.requests
    assert (r.listener, r.method, r.path, r.query, r.range, r.status, r.bytes_sent, r.token) == (
        "hub",
        "GET",
        "/org/model/resolve/main/config.json",
        {"download": ["true"]},
        "bytes=0-0",
        206,
        1,
        "hf_t",
    )
    assert r.client[0] == "127.0.0.1" and r.duration >= 0
    fakehub.clear_requests()
    assert fakehub.requests == []


def test_it_serves_https_with_a_given_certificate(hub_env, tmp_path):
    from gpustack_models.local import pki

    ca = pki.new_ca("fakehub test CA")
    ca_crt, _ = ca.write(tmp_path, "ca")
    crt, key = pki.issue(ca, "fakehub", ip_addresses=("127.0.0.1", "127.0.0.2"), server=True).write(tmp_path, "hub")
    with FakeHub(tls=(crt, key)) as hub:
        hub.add_hf_repo("org/model", {"w.safetensors": blob(2048)})
        assert hub.url.startswith("https://")
        s = http()
        s.verify = str(ca_crt)
        assert s.get(f"{hub.url}/org/model/resolve/main/w.safetensors").content == blob(2048)
        with pytest.raises(requests.exceptions.SSLError):
            http().get(f"{hub.url}/api/models/org/model", verify=True)


# --------------------------------------------------------------------------------------------------
# ModelScope
# --------------------------------------------------------------------------------------------------


def ms_envelope(response: requests.Response):
    body = response.json()
    assert set(body) >= {"Code", "Data", "Message", "Success"}
    return body


def test_it_answers_the_modelscope_api(fakehub):
    files = sample_files()
    commit = fakehub.add_ms_repo("owner/model", files, tags=("v1.0",))
    s = http()
    base = f"{fakehub.url}/api/v1/models/owner/model"

    info = ms_envelope(s.get(base))
    assert info["Code"] == 200 and info["Success"] is True and info["Data"]["Name"] == "model"
    revisions = ms_envelope(s.get(f"{base}/revisions"))["Data"]["RevisionMap"]
    assert [b["Revision"] for b in revisions["Branches"]] == ["master"]
    assert [t["Revision"] for t in revisions["Tags"]] == ["v1.0"]

    listing = ms_envelope(s.get(f"{base}/repo/files", params={"Revision": "v1.0", "Recursive": "True"}))["Data"]
    assert listing["LatestCommitter"]["Id"] == commit
    blobs = {f["Path"]: f for f in listing["Files"] if f["Type"] == "blob"}
    assert set(blobs) == set(files)
    assert {f["Path"] for f in listing["Files"] if f["Type"] == "tree"} == {"tokenizer", "original"}
    for path, data in files.items():
        assert blobs[path]["Sha256"] == hashlib.sha256(data).hexdigest() and blobs[path]["Size"] == len(data)
        assert blobs[path]["IsLFS"] is (len(data) >= fakehub.lfs_threshold)
    shallow = ms_envelope(s.get(f"{base}/repo/files", params={"Revision": commit, "Root": "tokenizer"}))["Data"]
    assert [f["Path"] for f in shallow["Files"]] == ["tokenizer/tokenizer.json"]

    params = {"Revision": "master", "FilePath": "config.json"}
    raw = s.get(f"{base}/repo", params=params, headers={"Range": "bytes=1-5"})
    assert raw.status_code == 206 and raw.content == files["config.json"][1:6]
    lfs = s.get(f"{base}/repo", params={"Revision": "master", "FilePath": "original/consolidated.pth"})
    assert lfs.content == files["original/consolidated.pth"] and lfs.history[0].status_code == 302

    missing = s.get(f"{fakehub.url}/api/v1/models/owner/none")
    assert missing.status_code == 404 and ms_envelope(missing)["Success"] is False
    bad_revision = s.get(f"{base}/repo/files", params={"Revision": "nope"})
    assert bad_revision.status_code == 404


def test_it_names_each_modelscope_entrys_last_commit_and_can_leave_commit_ids_out(fakehub):
    from modelscope.hub.api import HubApi

    first = fakehub.add_ms_repo("owner/model", {"config.json": b"{}", "w/a.bin": b"a", "w/b.bin": b"b"})
    second = fakehub.add_ms_commit("owner/model", {"w/b.bin": b"B"})
    s = http()
    base = f"{fakehub.url}/api/v1/models/owner/model"

    def listing(revision="master"):
        return ms_envelope(s.get(f"{base}/repo/files", params={"Revision": revision, "Recursive": "True"}))["Data"]

    data = listing()
    last = {f["Path"]: (f["Revision"], f["CommitId"]) for f in data["Files"]}
    assert last == {
        "w": (second, second),
        "config.json": (first, first),
        "w/a.bin": (first, first),
        "w/b.bin": (second, second),
    }
    dates = {f["Path"]: f["CommittedDate"] for f in data["Files"]}
    assert dates["w/a.bin"] < dates["w/b.bin"] == data["LatestCommitter"]["CommittedDate"]
    assert (data["LatestCommitter"]["Id"], data["LatestCommitter"]["ShortId"]) == (second, second[:8])
    assert {f["Revision"] for f in listing(first)["Files"]} == {first}
    revisions = ms_envelope(s.get(f"{base}/revisions"))["Data"]["RevisionMap"]
    assert set(revisions["Branches"][0]) == {"Revision", "CreatedAt", "CreatedBy", "Description", "Url"}

    fakehub.ms_latest_committer = "empty-id"
    assert listing()["LatestCommitter"] == {**data["LatestCommitter"], "Id": ""}  # ShortId and the rest stay
    fakehub.ms_latest_committer = "absent"
    fakehub.ms_file_commits = False
    bare = listing()
    assert "LatestCommitter" not in bare
    assert not {"Revision", "CommitId", "CommitMessage", "CommittedDate", "CommitterName"} & set(bare["Files"][0])
    # What the real client reads still works.
    assert {f["Path"] for f in HubApi().get_model_files("owner/model", revision="master")} >= {"config.json"}


def test_it_refuses_modelscope_requests_with_http_200_like_the_real_api(fakehub):
    fakehub.add_ms_repo("owner/model", {"config.json": b"{}"})
    fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    s = http()
    base = f"{fakehub.url}/api/v1/models/owner/model"

    fakehub.faults.refuse(re.compile(r"^/api/v1/models/owner/model(\?|$)"), 10010103009, "AccessToken is invalid")
    fakehub.faults.refuse("/repo/files", "ResourceNotFound", times=2)
    fakehub.faults.refuse(None, 404, times=None)  # every other ModelScope request, never a Hugging Face one
    assert s.get(f"{fakehub.url}/api/models/org/model").status_code == 200

    info = s.get(base)
    assert info.status_code == 200
    assert ms_envelope(info) | {"RequestId": None} == {
        "Code": 10010103009,
        "Data": None,
        "Message": "AccessToken is invalid",
        "RequestId": None,
        "Success": False,
    }
    for _ in range(2):
        listing = s.get(f"{base}/repo/files", params={"Revision": "master"})
        assert listing.status_code == 200 and ms_envelope(listing)["Code"] == "ResourceNotFound"
    revisions = s.get(f"{base}/revisions")
    assert revisions.status_code == 200 and ms_envelope(revisions)["Code"] == 404
    assert ms_envelope(s.get(base))["Code"] == 404  # the first knob is used up
    refused = [r for r in fakehub.requests if r.fault == "refuse"]
    assert len(refused) == 5 and {r.status for r in refused} == {200}

    fakehub.faults.clear()
    assert ms_envelope(s.get(base))["Success"] is True


def test_it_truncates_modelscope_listings_like_the_real_api(fakehub):
    from modelscope.hub.api import HubApi

    files = {f"part{d}/shard-{i:04d}.bin": b"%d-%d" % (d, i) for d in range(3) for i in range(1100)}
    files.update({"config.json": b"{}", "README.md": b"# model"})
    fakehub.add_ms_repo("owner/large", files)
    s = http()
    raw = ms_envelope(
        s.get(f"{fakehub.url}/api/v1/models/owner/large/repo/files", params={"Revision": "master", "Recursive": "True"})
    )["Data"]["Files"]
    assert len(raw) == 3000  # 3305 entries: truncated, silently

    listed = HubApi().get_model_files("owner/large", revision="master")
    assert {f["Path"] for f in listed} >= set(files)
    roots = {r.query.get("Root", [None])[0] for r in fakehub.requests_matching("/repo/files")}
    assert roots >= {None, "part0", "part1", "part2"}  # the client walked the directories

    fakehub.ms_page_size = 10
    small = ms_envelope(
        s.get(f"{fakehub.url}/api/v1/models/owner/large/repo/files", params={"Revision": "master", "Root": "part1"})
    )["Data"]["Files"]
    assert len(small) == 10 and all(f["Path"].startswith("part1/") for f in small)


def test_it_serves_modelscope_snapshot_download(fakehub, tmp_path):
    from modelscope.hub.snapshot_download import snapshot_download

    files = sample_files()
    first = fakehub.add_ms_repo("owner/model", files, tags=("v1.0",))
    fakehub.add_ms_commit("owner/model", {"config.json": b'{"v": 2}'})
    for revision, expected in (("v1.0", files), ("master", {**files, "config.json": b'{"v": 2}'}), (first, files)):
        root = Path(snapshot_download("owner/model", cache_dir=str(tmp_path / revision), revision=revision))
        assert {p: (root / p).read_bytes() for p in expected} == expected
    cdn = [r for r in fakehub.requests if r.listener == "cdn"]
    assert cdn and all(r.token is None and r.status == 200 for r in cdn)


def test_it_lets_modelscope_verify_and_retry_a_corrupted_download(fakehub, tmp_path):
    from modelscope.hub.snapshot_download import snapshot_download

    data = blob(3000, 21)
    fakehub.add_ms_repo("owner/model", {"w.safetensors": data})
    fakehub.faults.corrupt("w.safetensors", listener="cdn", times=1)
    root = Path(snapshot_download("owner/model", cache_dir=str(tmp_path), revision="master"))
    assert (root / "w.safetensors").read_bytes() == data
    assert [r.fault for r in fakehub.requests if r.listener == "cdn"] == ["corrupt", None]


def test_it_keeps_private_modelscope_repositories_private(fakehub, tmp_path):
    from modelscope.hub.api import HubApi
    from modelscope.hub.snapshot_download import snapshot_download

    fakehub.add_ms_repo("owner/private", {"config.json": b"{}"}, private=True, token="ms-owner")
    fakehub.add_token("ms-stranger")
    s = http()
    url = f"{fakehub.url}/api/v1/models/owner/private"
    assert s.get(url).status_code == 401
    assert s.get(url, headers={"Authorization": "Bearer ms-stranger"}).status_code == 403
    assert s.get(url, cookies={"m_session_id": "ms-owner"}).status_code == 200

    with pytest.raises(Exception) as denied:
        HubApi().get_model_files("owner/private")
    assert "401" in str(denied.value)
    assert [f["Path"] for f in HubApi(token="ms-owner").get_model_files("owner/private")] == ["config.json"]
    root = Path(snapshot_download("owner/private", cache_dir=str(tmp_path), token="ms-owner"))
    assert (root / "config.json").read_bytes() == b"{}"
