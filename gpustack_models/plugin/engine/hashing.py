"""File hashes whose intermediate state can be saved to disk and restored in another process.

A download that was interrupted (even by ``kill -9``) must resume without re-reading the bytes it
had already hashed, so the running hash state has to be checkpointed next to the written ranges.
CPython's ``hashlib`` objects cannot be serialised, so the two digests the manifest uses are
computed here with OpenSSL's classic one-shot-context API (``SHA256_Init/Update/Final`` and
``SHA1_*``) through ``ctypes``. Their contexts, ``SHA256_CTX`` and ``SHA_CTX``, are plain structs
declared in the public ``openssl/sha.h`` header (and unchanged since OpenSSL 0.9.8), so their bytes
*are* the hash state: saving them is a copy, restoring them is a copy back.

- same speed as ``hashlib`` (the same OpenSSL assembly, SHA-NI where the CPU has it);
- ``ctypes`` releases the GIL for the duration of each call, so hashing a large buffer runs in
  parallel with the other download threads, as ``hashlib`` does for large buffers;
- the saved state is node-local: it is tagged with the layout (algorithm, struct size, byte order)
  and refused if it does not match, in which case the caller re-hashes the file's prefix from disk.

Where that API is unavailable (no ``libcrypto`` found, or a self-test fails) ``hashlib`` is used and
``state()`` returns ``None``: downloads still resume, but re-read the already written prefix once to
rebuild the hash.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import sys
import threading
from typing import Literal

Algorithm = Literal["sha256", "gitsha1"]

# sizeof(SHA256_CTX): h[8], Nl, Nh, data[16], num, md_len (all 32-bit); sizeof(SHA_CTX): h0..h4, Nl,
# Nh, data[16], num.
_CTX_SIZE = {"sha256": 112, "gitsha1": 96}
_DIGEST_SIZE = {"sha256": 32, "gitsha1": 20}
_FUNCTIONS = {
    "sha256": ("SHA256_Init", "SHA256_Update", "SHA256_Final"),
    "gitsha1": ("SHA1_Init", "SHA1_Update", "SHA1_Final"),
}
_STATE_TAG = {name: f"openssl-{name}-ctx{size}-{sys.byteorder}" for name, size in _CTX_SIZE.items()}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_checked = False


def _load_libcrypto() -> ctypes.CDLL | None:
    """The process's libcrypto with the SHA functions declared, or ``None`` if unusable here."""
    global _lib, _lib_checked
    if _lib_checked:
        return _lib
    with _lock:
        if _lib_checked:
            return _lib
        lib = None
        candidates = [ctypes.util.find_library("crypto"), "libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.dylib"]
        for name in candidates:
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                for init, update, final in _FUNCTIONS.values():
                    getattr(lib, init).argtypes = [ctypes.c_void_p]
                    getattr(lib, init).restype = ctypes.c_int
                    getattr(lib, update).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
                    getattr(lib, update).restype = ctypes.c_int
                    getattr(lib, final).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                    getattr(lib, final).restype = ctypes.c_int
                if not _self_test(lib):
                    lib = None
            except (OSError, AttributeError):
                lib = None
            if lib is not None:
                break
        _lib, _lib_checked = lib, True
        return lib


def _self_test(lib: ctypes.CDLL) -> bool:
    """Known answers, and a state saved mid-way then restored into a fresh context, for both algorithms."""
    data = bytes(range(256)) * 9  # not a multiple of the block size: the partial block is in the state
    for algorithm, (init, update, final) in _FUNCTIONS.items():
        size = _CTX_SIZE[algorithm]
        ctx = ctypes.create_string_buffer(size + 64)  # room to spare, in case the struct were larger
        guard = ctx.raw[size:]
        if getattr(lib, init)(ctx) != 1:
            return False
        getattr(lib, update)(ctx, data, 1000)
        if ctx.raw[size:] != guard:
            return False  # the library wrote past the struct size we assume
        saved = ctx.raw[:size]
        restored = ctypes.create_string_buffer(saved, size + 64)
        getattr(lib, update)(restored, data[1000:], len(data) - 1000)
        out = ctypes.create_string_buffer(_DIGEST_SIZE[algorithm])
        getattr(lib, final)(out, restored)
        expected = (hashlib.sha256 if algorithm == "sha256" else hashlib.sha1)(data).digest()
        if out.raw != expected:
            return False
    return True


def resumable_available() -> bool:
    """True when hash states can be saved and restored in this process."""
    return _load_libcrypto() is not None


def _address(buffer) -> tuple[object, int]:
    """(object to keep alive, length) for passing ``buffer`` to C without a copy."""
    if isinstance(buffer, bytes):
        return buffer, len(buffer)
    view = memoryview(buffer)
    if view.readonly:
        data = view.tobytes()
        return data, len(data)
    if not view.contiguous:
        data = view.tobytes()
        return data, len(data)
    nbytes = view.nbytes
    if nbytes == 0:
        return b"", 0
    return (ctypes.c_char * nbytes).from_buffer(view.cast("B")), nbytes


class FileHash:
    """The hash a manifest entry names: ``sha256`` of the content, or the git blob id (``gitsha1``:
    sha1 of ``b"blob <size>\\0"`` followed by the content). ``size`` is the file's full size (it is
    part of the git blob header).

    ``update()`` takes bytes, a bytearray or a writable memoryview without copying. ``state()`` is
    an opaque ASCII string (or ``None`` without resumable support) for ``FileHash.restore``.
    """

    __slots__ = ("algorithm", "size", "_ctx", "_hashlib", "_fn_update", "_fn_final")

    def __init__(self, algorithm: Algorithm, size: int, *, _resumable: bool | None = None):
        if algorithm not in _CTX_SIZE:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        self.algorithm = algorithm
        self.size = size
        lib = _load_libcrypto() if _resumable is not False else None
        self._ctx = None
        self._hashlib = None
        if lib is not None:
            init, update, final = _FUNCTIONS[algorithm]
            self._ctx = ctypes.create_string_buffer(_CTX_SIZE[algorithm])
            getattr(lib, init)(self._ctx)
            self._fn_update = getattr(lib, update)
            self._fn_final = getattr(lib, final)
        else:
            self._hashlib = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()
        if algorithm == "gitsha1":
            self.update(b"blob %d\0" % size)

    @property
    def resumable(self) -> bool:
        return self._ctx is not None

    def update(self, buffer) -> None:
        if self._ctx is None:
            self._hashlib.update(buffer)
            return
        keep, length = _address(buffer)
        if length:
            self._fn_update(self._ctx, keep, length)

    def hexdigest(self) -> str:
        """The digest of everything so far (the running state is left untouched)."""
        if self._ctx is None:
            return self._hashlib.hexdigest()
        copy = ctypes.create_string_buffer(self._ctx.raw, _CTX_SIZE[self.algorithm])
        out = ctypes.create_string_buffer(_DIGEST_SIZE[self.algorithm])
        self._fn_final(out, copy)
        return out.raw.hex()

    def state(self) -> str | None:
        """The running state as ASCII, or ``None`` when it cannot be saved."""
        if self._ctx is None:
            return None
        return _STATE_TAG[self.algorithm] + ":" + base64.b64encode(self._ctx.raw).decode("ascii")

    @classmethod
    def restore(cls, algorithm: Algorithm, size: int, state: str | None) -> FileHash | None:
        """A hash continuing from ``state``; ``None`` if that state is unusable here (the caller
        then starts over and re-reads the prefix)."""
        if not state or not isinstance(state, str) or _load_libcrypto() is None:
            return None
        tag, _, encoded = state.partition(":")
        if tag != _STATE_TAG.get(algorithm):
            return None
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError):
            return None
        if len(raw) != _CTX_SIZE[algorithm]:
            return None
        restored = cls(algorithm, size)
        ctypes.memmove(restored._ctx, raw, len(raw))
        return restored
