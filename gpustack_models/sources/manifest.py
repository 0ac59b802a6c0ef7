"""The manifest of an artifact: which files, with which checksums, and the digest naming them.

The text whose sha256 is the manifest digest is, byte for byte::

    gpustack-manifest v1\\n
    <alg>:<hex> <size> <path>\\n        (one line per file, sorted by the path's UTF-8 bytes)

where a Git LFS file (and every ModelScope file) uses ``sha256:<sha256 of the content>`` and any
other Hugging Face file ``gitsha1:<git blob id>``. The digest is ``sha256:<64 lowercase hex>``. It
names content, not a source: the same files in any repository, on any hub, give the same digest.

File selection mirrors what ``huggingface_hub`` itself downloads for ``allow_patterns`` /
``ignore_patterns`` (it calls the same function): ``fnmatchcase`` on the whole path, where ``*``
also crosses ``/``; a pattern ending in ``/`` selects everything under that directory; a path must
match some allow pattern (when allow patterns are given) and no ignore pattern, so ignore wins.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gpustack_models.sources.hub_errors import EmptyManifest, InvalidManifest

MANIFEST_HEADER = "gpustack-manifest v1\n"

Algorithm = Literal["sha256", "gitsha1"]

_HEX_LENGTH = {"sha256": 64, "gitsha1": 40}
_HEX = re.compile(r"[0-9a-f]+")
# ASCII control characters: a newline would split a manifest line, NUL cannot be a file name.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InvalidPath(ValueError):
    """A file path that cannot be part of a manifest (see ``validate_path``)."""


def validate_path(path: str) -> str:
    """Return ``path`` if it is a relative UTF-8 path with no empty, ``.`` or ``..`` segment.

    Also refused: ASCII control characters (a newline would break the manifest's line format).
    Segments are separated by ``/`` only.
    """
    if not isinstance(path, str):
        raise InvalidPath(f"file path must be a string, not {type(path).__name__}")
    if path == "":
        raise InvalidPath("file path is empty")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath(f"file path {path!r} is not valid UTF-8") from None
    if _CONTROL.search(path):
        raise InvalidPath(f"file path {path!r} contains a control character")
    if path.startswith("/"):
        raise InvalidPath(f"file path {path!r} is absolute")
    for segment in path.split("/"):
        if segment == "":
            raise InvalidPath(f"file path {path!r} has an empty segment")
        if segment in (".", ".."):
            raise InvalidPath(f"file path {path!r} has a {segment!r} segment")
    return path


@dataclass(frozen=True)
class ManifestFile:
    """One file of a manifest.

    ``algorithm`` is ``"sha256"`` (LFS files, ModelScope files: ``hexdigest`` is the sha256 of the
    content) or ``"gitsha1"`` (other Hugging Face files: ``hexdigest`` is the git blob id, the sha1
    of ``b"blob <size>\\0" + content``). ``lfs`` records whether the hub stores it in LFS.
    """

    path: str
    size: int
    algorithm: Algorithm
    hexdigest: str
    lfs: bool = False

    def __post_init__(self):
        validate_path(self.path)
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"{self.path}: size must be a non-negative integer, not {self.size!r}")
        if self.algorithm not in _HEX_LENGTH:
            raise ValueError(f"{self.path}: algorithm must be 'sha256' or 'gitsha1', not {self.algorithm!r}")
        hexdigest = self.hexdigest.lower() if isinstance(self.hexdigest, str) else self.hexdigest
        if (
            not isinstance(hexdigest, str)
            or len(hexdigest) != _HEX_LENGTH[self.algorithm]
            or not _HEX.fullmatch(hexdigest)
        ):
            raise ValueError(
                f"{self.path}: {self.algorithm} digest must be {_HEX_LENGTH[self.algorithm]} hex characters,"
                f" not {self.hexdigest!r}"
            )
        object.__setattr__(self, "hexdigest", hexdigest)

    @property
    def checksum(self) -> str:
        """``<alg>:<hex>``, as written in the manifest."""
        return f"{self.algorithm}:{self.hexdigest}"

    @property
    def line(self) -> str:
        """This file's manifest line, newline included."""
        return f"{self.algorithm}:{self.hexdigest} {self.size} {self.path}\n"


@dataclass(frozen=True)
class ResolvedRevision:
    """What a hub revision resolves to: the commit and every file of the repository at it.

    ``pinned`` (the default) means ``commit`` is a 40-hex commit id and ``files`` is exactly the
    repository at that commit: what a download at ``commit`` gets, however the branch or tag moves
    later. Record ``commit`` as the resolved revision only then.

    ``pinned`` False means the hub named no commit for the revision (ModelScope's listing can leave
    ``LatestCommitter.Id`` empty, see ``modelscope``): ``commit`` is then the revision the files were
    listed at (the branch or tag name as given), ``files`` what it held at resolution time, and a
    download at it later may get other files. ``note`` says so in a sentence, for a condition
    message; it is empty when pinned.

    ``revision`` is the branch, tag or commit the hub was asked for, when the hub module chose it (a
    ModelScope repository's default branch); ``None`` when it is the one the caller gave.
    """

    commit: str
    files: list[ManifestFile]
    pinned: bool = True
    note: str = ""
    revision: str | None = None

    def __post_init__(self):
        if not self.pinned and not self.note:
            raise ValueError("an unpinned resolution needs a note saying why")


def _sorted_unique(files: Iterable[ManifestFile]) -> list[ManifestFile]:
    ordered = sorted(files, key=lambda f: f.path.encode("utf-8"))
    for previous, current in zip(ordered, ordered[1:]):
        if previous.path == current.path:
            raise ValueError(f"file path {current.path!r} appears twice in the manifest")
    return ordered


def select_files(
    files: Iterable[ManifestFile],
    allow_patterns: Sequence[str] | str | None = None,
    ignore_patterns: Sequence[str] | str | None = None,
) -> list[ManifestFile]:
    """The files ``huggingface_hub`` would download with these patterns, in their original order.

    ``None`` means "no such list". An empty allow list keeps nothing, exactly as the client does.
    """
    from huggingface_hub.utils import filter_repo_objects  # the worker's alone: the node plugin loads no hub client

    return list(
        filter_repo_objects(
            files,
            allow_patterns=_as_list(allow_patterns),
            ignore_patterns=_as_list(ignore_patterns),
            key=lambda f: f.path,
        )
    )


def _as_list(patterns: Sequence[str] | str | None) -> list[str] | None:
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [patterns]
    return list(patterns)


def _patterns_said(allow_patterns, ignore_patterns) -> str:
    """What the spec's patterns selected, in the spec's words: ``no file matches spec.allowPatterns *.GGUF``."""
    allow, ignore = _as_list(allow_patterns), _as_list(ignore_patterns)
    said = f"no file matches spec.allowPatterns {', '.join(allow)}" if allow else "no file is left"
    return f"{said} once spec.ignorePatterns {', '.join(ignore)} are left out" if ignore else said


def _case_hint(files: list[ManifestFile], allow_patterns, ignore_patterns) -> str:
    """Patterns match case-sensitively: say so, and how many files matching without case would keep."""
    lowered = [dataclasses.replace(f, path=f.path.lower()) for f in files]
    lower = [p.lower() for p in _as_list(allow_patterns) or []] or None
    ignored = [p.lower() for p in _as_list(ignore_patterns) or []] or None
    kept = len(select_files(lowered, lower, ignored))
    noun = "file" if kept == 1 else "files"
    return (
        f" (patterns are case-sensitive: ignoring case they would select {kept} {noun})"
        if kept
        else (" (patterns are case-sensitive)")
    )


def _some_paths(files: list[ManifestFile], shown: int = 10) -> str:
    """A few of the paths that do exist, for a person fixing the patterns."""
    paths = sorted((f.path for f in files), key=lambda p: p.encode("utf-8"))
    listed = ", ".join(paths[:shown])
    more = f", and {len(paths) - shown} more" if len(paths) > shown else ""
    noun = "file" if len(paths) == 1 else "files"
    return f"the revision has {len(paths)} {noun}: {listed}{more}"


def manifest_text(files: Iterable[ManifestFile]) -> str:
    """The manifest text (encode it as UTF-8 for the exact bytes). Duplicate paths are refused."""
    return MANIFEST_HEADER + "".join(f.line for f in _sorted_unique(files))


def manifest_digest(files: Iterable[ManifestFile]) -> str:
    """``sha256:<hex>`` of the UTF-8 manifest text."""
    return "sha256:" + hashlib.sha256(manifest_text(files).encode("utf-8")).hexdigest()


def build_manifest(
    files: Iterable[ManifestFile],
    allow_patterns: Sequence[str] | str | None = None,
    ignore_patterns: Sequence[str] | str | None = None,
) -> tuple[list[ManifestFile], str]:
    """Select with the patterns and digest the result: ``(files sorted as in the text, digest)``.

    Raises ``EmptyManifest`` when nothing is selected and ``InvalidManifest`` on a duplicate path.
    """
    files = list(files)
    selected = select_files(files, allow_patterns, ignore_patterns)
    if not selected:
        if not files:
            raise EmptyManifest("the repository has no file at this revision")
        said = _patterns_said(allow_patterns, ignore_patterns)
        raise EmptyManifest(f"{said}{_case_hint(files, allow_patterns, ignore_patterns)}; {_some_paths(files)}")
    try:
        ordered = _sorted_unique(selected)
    except ValueError as exc:
        raise InvalidManifest(str(exc)) from None
    return ordered, manifest_digest(ordered)
