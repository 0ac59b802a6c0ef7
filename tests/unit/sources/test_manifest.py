"""The manifest on its own: its text line by line, a digest that names the content whatever order the files
are listed in, the paths and checksums it takes, and the selection by patterns as ``huggingface_hub``
applies them."""

import hashlib
import itertools

import pytest

from gpustack_models.sources import (
    EmptyManifest,
    InvalidManifest,
    InvalidPath,
    ManifestFile,
    ResolvedRevision,
    build_manifest,
    manifest_digest,
    manifest_text,
    select_files,
    validate_path,
)
from gpustack_models.sources.manifest import MANIFEST_HEADER

SHA_EMPTY = hashlib.sha256(b"").hexdigest()
SHA_HELLO = hashlib.sha256(b"hello\n").hexdigest()
BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # the git blob id of an empty file

FILES = [
    ManifestFile("model.safetensors", 6, "sha256", SHA_HELLO, lfs=True),
    ManifestFile("config.json", 0, "gitsha1", BLOB),
    ManifestFile("tokenizer/vocab.txt", 0, "sha256", SHA_EMPTY, lfs=True),
]


def test_the_text_is_the_header_then_one_line_per_file_sorted_by_path():
    assert manifest_text(FILES) == (
        "gpustack-manifest v1\n"
        f"gitsha1:{BLOB} 0 config.json\n"
        f"sha256:{SHA_HELLO} 6 model.safetensors\n"
        f"sha256:{SHA_EMPTY} 0 tokenizer/vocab.txt\n"
    )
    assert manifest_text([]) == MANIFEST_HEADER


def test_the_digest_is_the_sha256_of_the_text():
    text = manifest_text(FILES).encode()
    assert manifest_digest(FILES) == "sha256:" + hashlib.sha256(text).hexdigest()


def test_the_digest_is_stable_and_the_same_in_any_order():
    digests = {manifest_digest(list(order)) for order in itertools.permutations(FILES)}
    assert digests == {manifest_digest(FILES)}
    assert manifest_digest(FILES) == manifest_digest(tuple(FILES))  # any iterable, read once


def test_paths_sort_by_their_utf8_bytes_not_by_letters():
    files = [ManifestFile(p, 0, "sha256", SHA_EMPTY) for p in ("é.txt", "z.txt", "B.txt", "a/b", "a-b", "a.b")]
    listed = [line.rsplit(" ", 1)[1] for line in manifest_text(files).splitlines()[1:]]
    assert listed == ["B.txt", "a-b", "a.b", "a/b", "z.txt", "é.txt"]


@pytest.mark.parametrize(
    "change",
    [
        {"path": "other.safetensors"},
        {"size": 7},
        {"hexdigest": SHA_EMPTY},
        {"algorithm": "gitsha1", "hexdigest": BLOB},
    ],
)
def test_any_change_of_a_file_changes_the_digest(change):
    first = FILES[0]
    fields = {"path": first.path, "size": first.size, "algorithm": first.algorithm, "hexdigest": first.hexdigest}
    changed = [ManifestFile(**(fields | change), lfs=True)] + FILES[1:]
    assert manifest_digest(changed) != manifest_digest(FILES)


def test_where_a_file_is_stored_does_not_change_the_digest():
    moved = [ManifestFile(f.path, f.size, f.algorithm, f.hexdigest, lfs=not f.lfs) for f in FILES]
    assert manifest_digest(moved) == manifest_digest(FILES)


def test_a_checksum_is_kept_in_lowercase_and_must_have_its_algorithms_length():
    upper = ManifestFile("a", 6, "sha256", SHA_HELLO.upper())
    assert upper.hexdigest == SHA_HELLO and upper.checksum == f"sha256:{SHA_HELLO}"
    assert upper.line == f"sha256:{SHA_HELLO} 6 a\n"
    for algorithm, hexdigest in (("sha256", BLOB), ("gitsha1", SHA_HELLO), ("sha256", "g" * 64), ("md5", BLOB)):
        with pytest.raises(ValueError):
            ManifestFile("a", 0, algorithm, hexdigest)
    for size in (-1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="size must be a non-negative integer"):
            ManifestFile("a", size, "sha256", SHA_EMPTY)


@pytest.mark.parametrize("path", ["a", "dir/file.bin", "a b/c", ".hidden", "..x", "é/ü.json"])
def test_it_takes_relative_paths(path):
    assert validate_path(path) == path


@pytest.mark.parametrize(
    "path, says",
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("./a", "'.' segment"),
        ("a/../b", "'..' segment"),
        ("a\nb", "control character"),
        ("a\x00b", "control character"),
        ("\udcff", "not valid UTF-8"),
        (7, "must be a string"),
    ],
)
def test_it_refuses_paths_a_manifest_line_cannot_hold(path, says):
    with pytest.raises(InvalidPath, match=says):
        validate_path(path)


def test_a_path_listed_twice_is_refused():
    with pytest.raises(ValueError, match="appears twice"):
        manifest_text(FILES + [FILES[0]])
    with pytest.raises(InvalidManifest, match="appears twice"):
        build_manifest(FILES + [FILES[1]])


@pytest.mark.parametrize(
    "allow, ignore, kept",
    [
        (None, None, ["model.safetensors", "config.json", "tokenizer/vocab.txt"]),
        ("*.json", None, ["config.json"]),
        (["*.txt"], None, ["tokenizer/vocab.txt"]),  # `*` crosses `/`
        (["tokenizer/"], None, ["tokenizer/vocab.txt"]),  # a directory: everything under it
        (None, ["*.safetensors"], ["config.json", "tokenizer/vocab.txt"]),
        (["*"], ["tokenizer/*"], ["model.safetensors", "config.json"]),  # ignore wins
        (["*.JSON"], None, []),  # case-sensitive
        ([], None, []),  # an empty allow list keeps nothing, as the client does
    ],
)
def test_it_selects_files_as_the_hub_client_does_in_their_order(allow, ignore, kept):
    assert [f.path for f in select_files(FILES, allow, ignore)] == kept


def test_building_a_manifest_selects_sorts_and_digests():
    files, digest = build_manifest(FILES, allow_patterns=["*.json", "*.safetensors"])
    assert [f.path for f in files] == ["config.json", "model.safetensors"]
    assert digest == manifest_digest(FILES[:2])


def test_a_selection_that_keeps_nothing_names_a_few_of_the_files_there_are():
    many = [ManifestFile(f"f{i:02}.bin", 0, "sha256", SHA_EMPTY) for i in range(12)]
    with pytest.raises(EmptyManifest) as empty:
        build_manifest(many, allow_patterns="*.gguf")
    message = empty.value.message
    assert message.startswith("no file matches spec.allowPatterns *.gguf (patterns are case-sensitive); the revision")
    assert message.endswith("the revision has 12 files: f00.bin, f01.bin, f02.bin, f03.bin, f04.bin, f05.bin, "
                            "f06.bin, f07.bin, f08.bin, f09.bin, and 2 more")  # fmt: skip
    with pytest.raises(EmptyManifest, match="the repository has no file at this revision"):
        build_manifest([])


def test_a_selection_that_keeps_nothing_says_so_in_the_specs_words_and_hints_at_case():
    files = [ManifestFile(p, 0, "sha256", SHA_EMPTY) for p in ("model.gguf", "tokenizer.GGUF", "README.md")]
    with pytest.raises(EmptyManifest) as upper:
        build_manifest(files, allow_patterns=["*.GGML"], ignore_patterns=["README*"])
    assert upper.value.message.startswith(
        "no file matches spec.allowPatterns *.GGML once spec.ignorePatterns README* are left out (patterns are"
        " case-sensitive); the revision has 3 files"
    )
    with pytest.raises(EmptyManifest) as case:
        build_manifest(files, allow_patterns=["*.Gguf"])
    assert case.value.message.startswith(
        "no file matches spec.allowPatterns *.Gguf (patterns are case-sensitive: ignoring case they would select"
        " 2 files); the revision has 3 files: README.md, model.gguf, tokenizer.GGUF"
    )
    assert "[" not in case.value.message and "None" not in case.value.message


def test_a_resolution_that_is_not_pinned_says_why():
    assert ResolvedRevision("c" * 40, FILES).pinned
    with pytest.raises(ValueError, match="needs a note"):
        ResolvedRevision("main", FILES, pinned=False)
    assert ResolvedRevision("main", FILES, pinned=False, note="the hub named no commit").note
