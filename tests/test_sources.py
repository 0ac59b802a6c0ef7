"""The hub side of resolution: manifest digests, and both resolvers against the fake hub."""

from __future__ import annotations

import hashlib
import random
import re
import socket

import pytest
from huggingface_hub.utils import filter_repo_objects

from gpustack_models.sources import (
    AccessDenied,
    EmptyManifest,
    InvalidManifest,
    InvalidPath,
    ManifestFile,
    RevisionNotFound,
    SourceError,
    SourceUnavailable,
    build_manifest,
    huggingface,
    manifest_digest,
    manifest_text,
    modelscope,
    select_files,
)
from tests.fakehub import FakeHub

# --------------------------------------------------------------------------------------------------
# Manifest: fixed vectors
# --------------------------------------------------------------------------------------------------

# Written by hand: gitsha1 of b"{}", sha256 of b"", gitsha1 of b"hello\n", sha256 of b"hello\n",
# gitsha1 of b"", sha256 of b"hello"; sorted by the paths' UTF-8 bytes ("B" < "a-" < "a." < "a/" <
# "z" < "\xc3\xa9"); a space inside a path stays as it is.
VECTOR = [
    ManifestFile("z", 0, "gitsha1", "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"),
    ManifestFile(
        "\u00e9t\u00e9.json", 5, "sha256", "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", lfs=True
    ),
    ManifestFile(
        "a/b c.txt", 6, "sha256", "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", lfs=True
    ),
    ManifestFile("a.b", 6, "gitsha1", "CE013625030BA8DBA906F756967F9E9CA394464A"),
    ManifestFile("B.json", 2, "gitsha1", "9e26dfeeb6e641a33dae4961196235bdb965b21b"),
    ManifestFile("a-b.bin", 0, "sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", lfs=True),
]
VECTOR_TEXT = (
    b"gpustack-manifest v1\n"
    b"gitsha1:9e26dfeeb6e641a33dae4961196235bdb965b21b 2 B.json\n"
    b"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 0 a-b.bin\n"
    b"gitsha1:ce013625030ba8dba906f756967f9e9ca394464a 6 a.b\n"
    b"sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 6 a/b c.txt\n"
    b"gitsha1:e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0 z\n"
    b"sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 5 \xc3\xa9t\xc3\xa9.json\n"
)
VECTOR_DIGEST = "sha256:0e900b195719c1be2f930a62711be50a070f2dd5c97a53cce4c107c316cfb299"
EMPTY_DIGEST = "sha256:0bbf75042c119a8050448f446432f593ffd95151dfb489917a5e3102b4a69559"


def test_it_writes_the_manifest_text_byte_for_byte():
    assert manifest_text(VECTOR).encode("utf-8") == VECTOR_TEXT
    assert manifest_text(reversed(VECTOR)) == manifest_text(VECTOR)


def test_it_digests_the_manifest_text():
    assert hashlib.sha256(VECTOR_TEXT).hexdigest() == VECTOR_DIGEST.removeprefix("sha256:")
    assert manifest_digest(VECTOR) == VECTOR_DIGEST
    assert manifest_digest([]) == EMPTY_DIGEST
    assert manifest_digest(VECTOR[:-1]) != VECTOR_DIGEST
    resized = [
        ManifestFile(f.path, f.size + 1, f.algorithm, f.hexdigest, f.lfs) if f.path == "z" else f for f in VECTOR
    ]
    assert manifest_digest(resized) != VECTOR_DIGEST


def test_it_normalizes_and_validates_checksums():
    assert VECTOR[3].hexdigest == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert VECTOR[3].line == "gitsha1:ce013625030ba8dba906f756967f9e9ca394464a 6 a.b\n"
    bad = (("sha256", "ab" * 20), ("gitsha1", "ab" * 32), ("sha256", "zz" * 32), ("md5", "ab" * 16))
    for algorithm, hexdigest in bad:
        with pytest.raises(ValueError):
            ManifestFile("x", 1, algorithm, hexdigest)
    with pytest.raises(ValueError):
        ManifestFile("x", -1, "sha256", "ab" * 32)


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "a//b", "a/", "./a", "a/./b", "..", "../x", "a/../b", "a/..", "a\nb", "a\x00b", "a\rb"]
    + ["\udcff"],  # a lone surrogate: not encodable as UTF-8
)
def test_it_refuses_unusable_paths(path):
    with pytest.raises(InvalidPath):
        ManifestFile(path, 1, "sha256", "ab" * 32)


def test_it_refuses_duplicate_paths():
    twice = [VECTOR[0], ManifestFile("z", 1, "sha256", "ab" * 32)]
    with pytest.raises(ValueError):
        manifest_text(twice)
    with pytest.raises(InvalidManifest):
        build_manifest(twice)


TREE = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "tokenizer/tokenizer.json",
    "README.md",
    "Config.JSON",
]


@pytest.mark.parametrize(
    "allow, ignore, expected",
    [
        (None, None, TREE),
        (["*.json"], None, [p for p in TREE if p.endswith(".json")]),  # "*" crosses "/", case-sensitive
        ("*.safetensors", None, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
        (None, ["original/"], [p for p in TREE if not p.startswith("original/")]),  # "dir/" = all under dir
        (
            ["*.json"],
            ["original/", "tokenizer/*"],
            ["config.json", "generation_config.json", "model.safetensors.index.json"],
        ),
        (["original/"], ["*.pth"], ["original/params.json"]),  # ignore wins
        (["original"], None, []),  # no trailing slash: the directory name itself, not its files
        ([], None, []),  # an empty allow list keeps nothing, as in huggingface_hub
        (["*"], ["*"], []),
    ],
)
def test_it_selects_files_like_huggingface_hub(allow, ignore, expected):
    files = [ManifestFile(p, len(p), "sha256", hashlib.sha256(p.encode()).hexdigest()) for p in TREE]
    selected = [f.path for f in select_files(files, allow, ignore)]
    assert selected == expected
    assert selected == list(filter_repo_objects(TREE, allow_patterns=allow, ignore_patterns=ignore))


def test_it_refuses_an_empty_selection():
    with pytest.raises(EmptyManifest) as nothing:
        build_manifest(VECTOR, ["*.gguf"])
    assert nothing.value.reason == "EmptyManifest" and "*.gguf" in str(nothing.value)
    assert (
        "(patterns are case-sensitive)" in nothing.value.message
        and "the revision has 6 files: B.json, a-b.bin" in str(nothing.value)
    )
    many = [ManifestFile(f"w{i:02d}.BIN", 1, "sha256", "0" * 64) for i in range(25)]
    with pytest.raises(EmptyManifest) as upper:
        build_manifest(many, ["*.bin"])
    assert "w09.BIN, and 15 more" in upper.value.message and "w10.BIN" not in upper.value.message
    with pytest.raises(EmptyManifest):
        build_manifest([])
    files, digest = build_manifest(VECTOR, ["*.json"], ["B*"])
    assert [f.path for f in files] == ["\u00e9t\u00e9.json"] and digest == manifest_digest(files)


# --------------------------------------------------------------------------------------------------
# Helpers computing what a digest must be, independently of gpustack_models.sources
# --------------------------------------------------------------------------------------------------


def data(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def expected_digest(files: dict[str, bytes], *, lfs_threshold: int | None) -> str:
    """The manifest digest written out by hand: ``lfs_threshold=None`` means sha256 for every file."""
    lines = []
    for path in sorted(files, key=lambda p: p.encode("utf-8")):
        content = files[path]
        if lfs_threshold is None or len(content) >= lfs_threshold:
            checksum = "sha256:" + hashlib.sha256(content).hexdigest()
        else:
            checksum = "gitsha1:" + hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
        lines.append(f"{checksum} {len(content)} {path}\n")
    return "sha256:" + hashlib.sha256(("gpustack-manifest v1\n" + "".join(lines)).encode()).hexdigest()


def model_files() -> dict[str, bytes]:
    return {
        "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
        "generation_config.json": b'{"do_sample": true}',
        "model-00001-of-00002.safetensors": data(6000, 1),
        "model-00002-of-00002.safetensors": data(4000, 2),
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "original/consolidated.00.pth": data(3000, 3),
        "original/params.json": b'{"dim": 4096}',
        "tokenizer/tokenizer.json": data(1500, 4),
        "tokenizer/special tokens.txt": b"<s>\n</s>\n",
    }


def hf(hub, repository, revision="main", **kwargs):
    kwargs.setdefault("timeout", 5)
    return huggingface.resolve(repository, revision, endpoint=hub.url, **kwargs)


def ms(hub, repository, revision="master", **kwargs):
    kwargs.setdefault("timeout", 5)
    return modelscope.resolve(repository, revision, endpoint=hub.url, **kwargs)


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------------
# Hugging Face
# --------------------------------------------------------------------------------------------------


def test_it_resolves_huggingface_branches_tags_and_commits(fakehub):
    first = fakehub.add_hf_repo("org/model", model_files(), tags=("v1",))
    second = fakehub.add_hf_commit("org/model", {"config.json": b"{}"})
    assert hf(fakehub, "org/model").commit == second
    assert hf(fakehub, "org/model", None).commit == second  # default: main
    assert hf(fakehub, "org/model", "v1").commit == first
    old = hf(fakehub, "org/model", first)
    assert old.commit == first
    assert manifest_digest(old.files) == expected_digest(model_files(), lfs_threshold=fakehub.lfs_threshold)


def test_it_lists_every_page_of_a_huggingface_tree(fakehub):
    files = {f"shards/{i:03d}.bin": data(50 + i, i) for i in range(40)}
    files.update(model_files())
    fakehub.add_hf_repo("org/many", files)
    fakehub.page_size = 7
    resolution = hf(fakehub, "org/many")
    assert sorted(f.path for f in resolution.files) == sorted(files)
    assert len(fakehub.requests_matching("/tree/")) == 8  # 49 files + 3 directories, 7 a page
    assert manifest_digest(resolution.files) == expected_digest(files, lfs_threshold=fakehub.lfs_threshold)


def test_it_checksums_lfs_files_by_sha256_and_others_by_git_blob_id(fakehub):
    fakehub.add_hf_repo("org/model", model_files())
    by_path = {f.path: f for f in hf(fakehub, "org/model").files}
    for path, content in model_files().items():
        f = by_path[path]
        assert f.size == len(content)
        if len(content) >= fakehub.lfs_threshold:
            assert (f.algorithm, f.hexdigest, f.lfs) == ("sha256", hashlib.sha256(content).hexdigest(), True)
        else:
            git_id = fakehub.file_info("org/model", path).blob.gitsha1
            assert (f.algorithm, f.hexdigest, f.lfs) == ("gitsha1", git_id, False)


def test_it_denies_what_the_huggingface_hub_refuses(fakehub):
    fakehub.add_hf_repo("org/private", {"config.json": b"{}"}, private=True, token="hf_owner")
    fakehub.add_hf_repo("org/gated", {"config.json": b"{}"}, gated=True)
    fakehub.add_token("hf_stranger")

    cases = [
        ("org/never-created", None),
        ("org/private", None),
        ("org/private", "hf_stranger"),
        ("org/private", "hf_forged"),
        ("org/gated", None),
        ("org/gated", "hf_stranger"),
        ("not a valid/repo/id", None),
    ]
    for repository, token in cases:
        with pytest.raises(AccessDenied) as denied:
            hf(fakehub, repository, token=token)
        assert denied.value.reason == "AccessDenied" and not denied.value.retryable, (repository, token)
        if repository in ("org/never-created", "org/private"):
            said = "no token was given" if token is None else "the token given has no access"
            assert said in denied.value.message, (repository, token, denied.value.message)

    assert hf(fakehub, "org/private", token="hf_owner").commit == fakehub.commit_id("org/private")
    fakehub.grant("org/gated", "hf_stranger")
    assert hf(fakehub, "org/gated", token="hf_stranger").commit == fakehub.commit_id("org/gated")
    assert [r.status for r in fakehub.requests_matching("auth-check")][-1] == 200


def test_it_reports_unknown_huggingface_revisions(fakehub):
    fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    for revision in ("v9", "refs/pr/7", "0" * 40):
        with pytest.raises(RevisionNotFound) as missing:
            hf(fakehub, "org/model", revision)
        assert missing.value.reason == "RevisionNotFound"


def test_an_unknown_huggingface_revision_names_the_branches_and_tags_the_repository_has(fakehub):
    fakehub.add_hf_repo("org/listed", {"config.json": b"{}"}, tags=("v1.0",))
    fakehub.add_hf_commit("org/listed", {"config.json": b"{}"}, branch="dev")
    with pytest.raises(RevisionNotFound) as missing:
        hf(fakehub, "org/listed", "mian")
    assert missing.value.message == "org/listed@mian: no such branch, tag or commit (branches: dev, main; tags: v1.0)"


def test_it_fails_fast_when_the_huggingface_hub_is_unavailable(fakehub):
    fakehub.add_hf_repo("org/model", {f"f{i}.txt": b"%d" % i for i in range(5)})
    fakehub.page_size = 2

    fakehub.faults.fail("/api/models/org/model/revision", 503)
    with pytest.raises(SourceUnavailable) as unavailable:
        hf(fakehub, "org/model")
    assert unavailable.value.retryable and unavailable.value.reason == "SourceUnavailable"
    assert "503" in str(unavailable.value)
    # At once: one attempt, none of the client's own retries (which sleep between attempts).
    assert [r.status for r in fakehub.requests_matching("/api/models/org/model/revision")] == [503]

    fakehub.clear_requests()
    fakehub.faults.fail("cursor=", 502, times=None)  # the second page of the tree
    with pytest.raises(SourceUnavailable):
        hf(fakehub, "org/model")
    assert [r.status for r in fakehub.requests_matching("/tree/")] == [200, 502]  # no retries of its own

    fakehub.faults.clear()
    fakehub.faults.fail("/tree/", 429, retry_after=7)
    with pytest.raises(SourceUnavailable) as limited:
        hf(fakehub, "org/model")
    assert limited.value.retry_after == 7
    assert hf(fakehub, "org/model").commit == fakehub.commit_id("org/model")


def test_it_reports_huggingface_network_failures_and_timeouts(fakehub):
    with pytest.raises(SourceUnavailable):
        huggingface.resolve("org/model", endpoint=closed_port_url(), timeout=2)

    fakehub.add_hf_repo("org/model", {"config.json": b"{}"})
    fakehub.faults.hang("/tree/")
    with pytest.raises(SourceUnavailable) as timed_out:
        hf(fakehub, "org/model", timeout=0.5)
    assert "Timeout" in str(timed_out.value)
    assert len(fakehub.requests_matching("/tree/")) == 1  # not retried


def test_it_sends_huggingface_requests_through_the_given_proxy_only(fakehub, hub_env):
    fakehub.add_hf_repo("org/model", model_files())
    fakehub.page_size = 3
    # The fake hub answers absolute-form requests too, so it can play the proxy of a host that does not exist.
    resolution = huggingface.resolve("org/model", endpoint="http://hub.invalid", proxy=fakehub.url, timeout=5)
    assert resolution.commit == fakehub.commit_id("org/model")
    assert fakehub.requests[0].host == "hub.invalid"
    with pytest.raises(SourceUnavailable):
        huggingface.resolve("org/model", endpoint="http://hub.invalid", timeout=5)

    # A proxy in the environment is not used by resolution.
    for name in ("NO_PROXY", "no_proxy"):
        hub_env.delenv(name, raising=False)
    hub_env.setenv("HTTP_PROXY", closed_port_url())
    hub_env.setenv("http_proxy", closed_port_url())
    assert hf(fakehub, "org/model").commit == resolution.commit


def test_it_trusts_the_given_ca_bundle_only(hub_env, tmp_path):
    from gpustack_models.local import pki

    ca = pki.new_ca("fake hub CA")
    ca_file, _ = ca.write(tmp_path, "ca")
    crt, key = pki.issue(ca, "fakehub", ip_addresses=("127.0.0.1", "127.0.0.2"), server=True).write(tmp_path, "hub")
    with FakeHub(tls=(crt, key)) as hub:
        hub.add_hf_repo("org/model", {"config.json": b"{}"})
        hub.add_ms_repo("owner/model", {"config.json": b"{}"})
        assert hf(hub, "org/model", ca_bundle=str(ca_file)).commit == hub.commit_id("org/model")
        assert ms(hub, "owner/model", ca_bundle=str(ca_file)).commit == hub.commit_id("owner/model", kind="ms")
        with pytest.raises(SourceUnavailable):
            hf(hub, "org/model")
        with pytest.raises(SourceUnavailable):
            ms(hub, "owner/model")
        # The variables of this environment do not count either.
        hub_env.setenv("SSL_CERT_FILE", str(ca_file))
        hub_env.setenv("REQUESTS_CA_BUNDLE", str(ca_file))
        with pytest.raises(SourceUnavailable):
            hf(hub, "org/model")
        with pytest.raises(SourceUnavailable):
            ms(hub, "owner/model")


def test_it_names_xet_backed_files_by_their_lfs_sha256(fakehub):
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = model_files()
    fakehub.add_hf_repo("org/lfs", files)
    fakehub.add_hf_repo("org/xet", files, xet=True)
    listed = HfApi(endpoint=fakehub.url, token=False).list_repo_tree("org/xet", recursive=True)
    xet_paths = {e.path for e in listed if isinstance(e, RepoFile) and e.xet_hash}
    assert xet_paths == {p for p, c in files.items() if len(c) >= fakehub.lfs_threshold}

    as_lfs, as_xet = hf(fakehub, "org/lfs"), hf(fakehub, "org/xet")
    assert set(as_xet.files) == set(as_lfs.files)  # the same paths, sizes, checksums and LFS flags
    assert manifest_text(as_xet.files) == manifest_text(as_lfs.files)
    xet_digest = build_manifest(as_xet.files)[1]
    assert xet_digest == build_manifest(as_lfs.files)[1] == expected_digest(files, lfs_threshold=fakehub.lfs_threshold)
    for f in as_xet.files:
        if f.path in xet_paths:
            assert (f.algorithm, f.hexdigest, f.lfs) == ("sha256", hashlib.sha256(files[f.path]).hexdigest(), True)


def test_it_refuses_a_xet_file_listed_without_its_sha256(fakehub):
    fakehub.add_hf_repo("org/xet", model_files(), xet=True)
    fakehub.add_hf_repo("org/small", {"config.json": b"{}"}, xet=True)  # nothing big enough for Xet
    fakehub.xet_lfs_info = False
    with pytest.raises(InvalidManifest) as invalid:
        hf(fakehub, "org/xet")
    assert invalid.value.reason == "InvalidManifest" and not invalid.value.retryable
    message = str(invalid.value)
    assert message.startswith("InvalidManifest: org/xet@main: model-00001-of-00002.safetensors: stored with Xet")
    assert fakehub.file_info("org/xet", "model-00001-of-00002.safetensors").xet_hash in message
    assert "without its LFS sha256" in message
    assert hf(fakehub, "org/small").commit == fakehub.commit_id("org/small")


# --------------------------------------------------------------------------------------------------
# ModelScope
# --------------------------------------------------------------------------------------------------


def test_it_resolves_modelscope_branches_tags_and_commits(fakehub):
    first = fakehub.add_ms_repo("owner/model", model_files(), tags=("v1.0",))
    second = fakehub.add_ms_commit("owner/model", {"config.json": b"{}"})
    assert ms(fakehub, "owner/model").commit == second
    assert ms(fakehub, "owner/model", None).commit == second  # default: master
    tagged = ms(fakehub, "owner/model", "v1.0")
    assert tagged.commit == first
    assert ms(fakehub, "owner/model", first).commit == first
    assert all(f.algorithm == "sha256" for f in tagged.files)
    assert manifest_digest(tagged.files) == expected_digest(model_files(), lfs_threshold=None)
    assert {f.path for f in tagged.files if f.lfs} == {p for p, c in model_files().items() if len(c) >= 1024}


def test_it_recovers_truncated_modelscope_listings_directory_by_directory(fakehub):
    files = {f"layers/{i}/w{j}.bin": b"%d.%d" % (i, j) for i in range(4) for j in range(3)}
    files.update({f"extra/{j}.txt": b"x%d" % j for j in range(3)})
    files.update({"config.json": b"{}", "README.md": b"# m"})
    commit = fakehub.add_ms_repo("owner/deep", files)
    fakehub.ms_page_size = 5
    resolution = ms(fakehub, "owner/deep", listing_limit=5)
    assert sorted(f.path for f in resolution.files) == sorted(files)
    assert manifest_digest(resolution.files) == expected_digest(files, lfs_threshold=None)
    listings = fakehub.requests_matching("/repo/files")
    assert len(listings) > 1
    assert all(r.query["Revision"] == [commit] for r in listings[1:])  # pinned to the commit

    # Told the wrong limit, the resolver cannot know the listing was cut short: the limit matters.
    short = ms(fakehub, "owner/deep", listing_limit=3000)
    assert len(short.files) < len(files)


def test_it_refuses_a_modelscope_directory_too_large_to_list(fakehub):
    fakehub.add_ms_repo("owner/flat", {f"w{i}.bin": b"%d" % i for i in range(8)})
    fakehub.ms_page_size = 5
    with pytest.raises(SourceUnavailable) as incomplete:
        ms(fakehub, "owner/flat", listing_limit=5)
    assert "cannot be complete" in str(incomplete.value)


def ms_listed_at(hub) -> list[str]:
    return [r.query["Revision"][0] for r in hub.requests_matching("/repo/files")]


@pytest.mark.parametrize("latest_committer", ["absent", "empty-id"])
def test_it_pins_modelscope_revisions_to_their_files_commit_when_the_listing_names_none(fakehub, latest_committer):
    first = fakehub.add_ms_repo("owner/model", model_files(), tags=("v1.0",))
    files = {**model_files(), "config.json": b"{}", "added.json": b"[]"}
    second = fakehub.add_ms_commit("owner/model", {"config.json": b"{}", "added.json": b"[]"})
    fakehub.ms_latest_committer = latest_committer
    for revision, commit, expected in (("master", second, files), ("v1.0", first, model_files())):
        fakehub.clear_requests()
        resolution = ms(fakehub, "owner/model", revision)
        assert (resolution.commit, resolution.pinned, resolution.note) == (commit, True, "")
        assert manifest_digest(resolution.files) == expected_digest(expected, lfs_threshold=None)
        assert ms_listed_at(fakehub) == [revision, commit]  # the files' commit, listed to check it holds them

    # A truncated listing: walked at the revision, then at the commit found, both completely.
    files = {f"layers/{i}/w{j}.bin": b"%d.%d" % (i, j) for i in range(4) for j in range(3)}
    fakehub.add_ms_repo("owner/deep", {**files, "config.json": b"{}"})
    commit = fakehub.add_ms_commit("owner/deep", {"layers/2/w1.bin": b"new"})
    fakehub.ms_page_size = 5
    fakehub.clear_requests()
    resolution = ms(fakehub, "owner/deep", listing_limit=5)
    assert (resolution.commit, resolution.pinned) == (commit, True)
    expected = {**files, "config.json": b"{}", "layers/2/w1.bin": b"new"}
    assert manifest_digest(resolution.files) == expected_digest(expected, lfs_threshold=None)
    listed = ms_listed_at(fakehub)
    assert set(listed) == {"master", commit} and listed.index(commit) == listed.count("master")


@pytest.mark.parametrize("latest_committer", ["absent", "empty-id"])
def test_it_does_not_pin_a_modelscope_revision_whose_commit_it_cannot_learn(fakehub, latest_committer):
    first = fakehub.add_ms_repo("owner/model", model_files(), tags=("v1.0",))
    fakehub.ms_latest_committer = latest_committer
    fakehub.ms_file_commits = False
    for revision in ("master", "v1.0"):
        resolution = ms(fakehub, "owner/model", revision)
        assert (resolution.commit, resolution.pinned) == (revision, False)  # never a branch name as a commit
        assert resolution.note == (
            f"ModelScope did not name the commit of owner/model@{revision}: its file listing has no"
            f" LatestCommitter.Id, and its files carry no commit ids. The files were listed at {revision!r}"
            " itself, which may move"
        )
        assert manifest_digest(resolution.files) == expected_digest(model_files(), lfs_threshold=None)
        assert ms_listed_at(fakehub)[-1] == revision

    # The files name their commits. The last commit only deleted a file: no file was last changed by
    # it. Pinned to the newest of the files' commits when that holds exactly these files...
    fakehub.ms_file_commits = True
    fakehub.add_ms_commit("owner/model", {"README.md": b"# m"})
    fakehub.add_ms_commit("owner/model", {"README.md": None})
    resolution = ms(fakehub, "owner/model")
    assert (resolution.commit, resolution.pinned) == (first, True)  # not master's own commit, the same files
    assert manifest_digest(resolution.files) == expected_digest(model_files(), lfs_threshold=None)

    # ... and not pinned when it does not: it still holds the file deleted since.
    changed = fakehub.add_ms_commit("owner/model", {"README.md": b"# m", "config.json": b"{}"})
    fakehub.add_ms_commit("owner/model", {"README.md": None})
    fakehub.clear_requests()
    resolution = ms(fakehub, "owner/model")
    assert (resolution.commit, resolution.pinned) == ("master", False)
    assert resolution.note == (
        f"ModelScope did not name the commit of owner/model@master: its file listing has no LatestCommitter.Id,"
        f" and the newest commit its files name ({changed[:12]}) does not hold exactly these files. The files"
        " were listed at 'master' itself, which may move"
    )
    expected = {**model_files(), "config.json": b"{}"}
    assert manifest_digest(resolution.files) == expected_digest(expected, lfs_threshold=None)
    assert ms_listed_at(fakehub) == ["master", changed]


def test_it_keeps_a_modelscope_commit_given_as_the_revision_pinned(fakehub):
    first = fakehub.add_ms_repo("owner/model", model_files())
    fakehub.add_ms_commit("owner/model", {"config.json": b"{}"})
    assert ms(fakehub, "owner/model").pinned is True  # LatestCommitter.Id, as ever
    fakehub.ms_latest_committer = "absent"
    fakehub.ms_file_commits = False
    fakehub.clear_requests()
    resolution = ms(fakehub, "owner/model", first)
    assert (resolution.commit, resolution.pinned, resolution.note) == (first, True, "")
    assert manifest_digest(resolution.files) == expected_digest(model_files(), lfs_threshold=None)
    assert ms_listed_at(fakehub) == [first]


def test_it_denies_what_modelscope_refuses(fakehub):
    fakehub.add_ms_repo("owner/private", {"config.json": b"{}"}, private=True, token="ms-owner")
    fakehub.add_ms_repo("owner/model", {"config.json": b"{}"})
    fakehub.add_token("ms-stranger")
    for repository, token in (
        ("owner/never-created", None),
        ("owner/private", None),
        ("owner/private", "ms-stranger"),
        ("owner/model", "ms-forged"),
        ("not-an-owner-slash-name", None),
    ):
        with pytest.raises(AccessDenied) as denied:
            ms(fakehub, repository, token=token)
        if repository in ("owner/never-created", "owner/private"):
            said = "no token was given" if token is None else "the token given has no access"
            assert said in denied.value.message, (repository, token, denied.value.message)
    assert ms(fakehub, "owner/private", token="ms-owner").commit == fakehub.commit_id("owner/private", kind="ms")
    for revision in ("v9", "f" * 40):
        with pytest.raises(RevisionNotFound):
            ms(fakehub, "owner/model", revision)


def test_an_unknown_modelscope_revision_names_the_branches_and_tags_the_repository_has(fakehub):
    fakehub.add_ms_repo("owner/listed", {"config.json": b"{}"}, tags=("v1.0",))
    with pytest.raises(RevisionNotFound) as missing:
        ms(fakehub, "owner/listed", "mian")
    assert missing.value.message == "owner/listed@mian: no such branch or tag (branches: master; tags: v1.0)"


def test_a_modelscope_artifact_without_a_revision_takes_main_where_the_repository_has_no_master(fakehub):
    commit = fakehub.add_ms_repo("owner/on-main", {"config.json": b"{}"}, revision="main")
    resolved = ms(fakehub, "owner/on-main", None)
    assert (resolved.commit, resolved.revision) == (commit, "main")
    assert ms(fakehub, "owner/on-main", "main").revision is None  # the caller's own revision is not repeated
    fakehub.add_ms_commit("owner/on-main", {"config.json": b"{}"}, revision="release")
    fakehub.add_ms_commit("owner/on-main", {"config.json": b"{}"}, revision="dev")
    assert ms(fakehub, "owner/on-main", None).revision == "main"  # main beside other branches
    fakehub.add_ms_repo("owner/two-branches", {"config.json": b"{}"}, revision="stable")
    fakehub.add_ms_commit("owner/two-branches", {"config.json": b"{}"}, revision="dev")
    with pytest.raises(RevisionNotFound) as unchosen:
        ms(fakehub, "owner/two-branches", None)
    assert unchosen.value.message == "owner/two-branches@master: no such branch or tag (branches: dev, stable)"


def test_it_fails_fast_when_modelscope_is_unavailable(fakehub):
    fakehub.add_ms_repo("owner/model", {"config.json": b"{}"})
    fakehub.faults.fail("/repo/files", 503)
    with pytest.raises(SourceUnavailable):
        ms(fakehub, "owner/model")
    assert [r.status for r in fakehub.requests_matching("/repo/files")] == [503]

    fakehub.faults.fail("/revisions", 429, retry_after=11)
    with pytest.raises(SourceUnavailable) as limited:
        ms(fakehub, "owner/model")
    assert limited.value.retry_after == 11

    fakehub.faults.hang("/api/v1/models/owner/model", times=1)
    with pytest.raises(SourceUnavailable):
        ms(fakehub, "owner/model", timeout=0.5)
    with pytest.raises(SourceUnavailable):
        modelscope.resolve("owner/model", endpoint=closed_port_url(), timeout=2)
    assert ms(fakehub, "owner/model").commit == fakehub.commit_id("owner/model", kind="ms")


def test_it_sends_modelscope_requests_through_the_given_proxy_only(fakehub, hub_env):
    fakehub.add_ms_repo("owner/model", model_files())
    resolution = modelscope.resolve("owner/model", endpoint="http://hub.invalid", proxy=fakehub.url, timeout=5)
    assert resolution.commit == fakehub.commit_id("owner/model", kind="ms")
    assert {r.host for r in fakehub.requests} == {"hub.invalid"}
    for name in ("NO_PROXY", "no_proxy"):
        hub_env.delenv(name, raising=False)
    hub_env.setenv("HTTP_PROXY", closed_port_url())
    hub_env.setenv("http_proxy", closed_port_url())
    assert ms(fakehub, "owner/model").commit == resolution.commit


# The business codes ModelScope answers with HTTP 200 and ``Success: false``, and what they mean for
# the repository (its info, its revisions) and for a listing at a revision.
MS_REFUSALS = [
    (401, AccessDenied, AccessDenied),
    (403, AccessDenied, AccessDenied),
    (10010103009, AccessDenied, AccessDenied),  # AccessToken is invalid or expired
    ("InvalidAuthentication", AccessDenied, AccessDenied),
    ("OperationNotAllowed", AccessDenied, AccessDenied),
    (404, AccessDenied, RevisionNotFound),
    (400, AccessDenied, RevisionNotFound),
    ("ResourceNotFound", AccessDenied, RevisionNotFound),
    ("InputParameterError", AccessDenied, RevisionNotFound),
    (429, SourceUnavailable, SourceUnavailable),
    ("RateLimitExceed", SourceUnavailable, SourceUnavailable),
    (500, SourceUnavailable, SourceUnavailable),
    (503, SourceUnavailable, SourceUnavailable),
    (10030000001, SourceUnavailable, SourceUnavailable),  # retryable commit conflict: not a read's answer
    ("QuotaLimitExceed", SourceUnavailable, SourceUnavailable),
    (10010101001, SourceUnavailable, SourceUnavailable),  # model already exists: not a read's answer
    (200, SourceUnavailable, SourceUnavailable),  # "Success": false with Code 200
    (99999999999, SourceUnavailable, SourceUnavailable),  # a code nobody knows yet
]


@pytest.mark.parametrize("code, on_repository, on_listing", MS_REFUSALS, ids=[str(c[0]) for c in MS_REFUSALS])
def test_it_maps_modelscope_refusals_answered_with_http_200(fakehub, code, on_repository, on_listing):
    commit = fakehub.add_ms_repo("owner/model", {"config.json": b"{}"}, tags=("v1",))
    endpoints = [
        (re.compile(r"^/api/v1/models/owner/model(\?|$)"), "v1", on_repository),
        ("/api/v1/models/owner/model/revisions", "v1", on_repository),
        ("/api/v1/models/owner/model/repo/files", "v1", on_listing),
        ("/api/v1/models/owner/model/repo/files", commit, on_listing),  # a commit: no revisions check
    ]
    for match, revision, expected in endpoints:
        fakehub.faults.refuse(match, code, "refused by the test")
        with pytest.raises(SourceError) as refused:
            ms(fakehub, "owner/model", revision)
        assert type(refused.value) is expected, (match, revision)
        assert refused.value.retryable is (expected is SourceUnavailable)
        assert f"code {code}: refused by the test" in str(refused.value)
    assert [r.status for r in fakehub.requests if r.fault == "refuse"] == [200] * len(endpoints)
    assert ms(fakehub, "owner/model", "v1").commit == commit  # every refusal used up


# --------------------------------------------------------------------------------------------------
# What a digest names
# --------------------------------------------------------------------------------------------------


def test_it_gives_the_same_files_the_same_digest_wherever_they_are(fakehub):
    files = model_files()
    a = fakehub.add_hf_repo("org/a", files)
    b = fakehub.add_hf_repo("other-org/b", files, branch="release")
    ra, rb = hf(fakehub, "org/a"), hf(fakehub, "other-org/b", "release")
    assert a != b and (ra.commit, rb.commit) == (a, b)
    assert build_manifest(ra.files)[1] == build_manifest(rb.files)[1]
    fakehub.add_hf_commit("other-org/b", {"config.json": b"{}"}, branch="release")
    assert build_manifest(hf(fakehub, "other-org/b", "release").files)[1] != build_manifest(ra.files)[1]

    # Only LFS files carry a sha256 on Hugging Face: when every file is LFS, a ModelScope copy matches.
    fakehub.lfs_threshold = 0
    fakehub.add_hf_repo("org/all-lfs", files)
    fakehub.add_ms_repo("owner/copy", files)
    hf_digest = build_manifest(hf(fakehub, "org/all-lfs").files)[1]
    assert hf_digest == build_manifest(ms(fakehub, "owner/copy").files)[1] == expected_digest(files, lfs_threshold=None)


@pytest.mark.parametrize(
    "allow, ignore, kept",
    [
        (None, None, None),
        (
            ["*.safetensors", "*.json"],
            ["original/"],
            lambda p: p.endswith((".safetensors", ".json")) and not p.startswith("original/"),
        ),
        (["*.json"], None, lambda p: p.endswith(".json")),
        (["tokenizer/"], None, lambda p: p.startswith("tokenizer/")),
        (["tokenizer/*"], ["*.txt"], lambda p: p == "tokenizer/tokenizer.json"),
        (None, ["*.pth", "*.safetensors"], lambda p: not p.endswith((".pth", ".safetensors"))),
    ],
)
def test_it_changes_the_digest_exactly_as_the_patterns_select(fakehub, allow, ignore, kept):
    files = model_files()
    fakehub.add_hf_repo("org/model", files)
    fakehub.add_ms_repo("owner/model", files)
    subset = {p: c for p, c in files.items() if kept is None or kept(p)}
    resolutions = ((hf(fakehub, "org/model"), fakehub.lfs_threshold), (ms(fakehub, "owner/model"), None))
    for resolution, threshold in resolutions:
        selected, digest = build_manifest(resolution.files, allow, ignore)
        assert sorted(f.path for f in selected) == sorted(subset)
        assert digest == expected_digest(subset, lfs_threshold=threshold)


def test_it_reports_patterns_that_keep_nothing(fakehub):
    fakehub.add_hf_repo("org/model", model_files())
    with pytest.raises(EmptyManifest) as empty:
        build_manifest(hf(fakehub, "org/model").files, ["*.gguf"])
    assert isinstance(empty.value, SourceError) and empty.value.reason == "EmptyManifest"
