"""A fake Hugging Face + ModelScope hub on loopback for tests (see ``server``)."""

from tests.fakehub.server import FakeHub, Fault, Faults, FileRef, RecordedRequest, git_blob_sha1, lfs_pointer

__all__ = ["FakeHub", "Fault", "Faults", "FileRef", "RecordedRequest", "git_blob_sha1", "lfs_pointer"]
