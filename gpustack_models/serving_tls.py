"""A TLS server's certificate, key and trusted CAs, kept current with their files: every TLS server of the
product (the API, the plugin's main and peer ports) takes its context from a ``ServingTLS``.

- Each new handshake checks the files (``file_stamps``: the resolved file's inode, mtime and size, so a
  Kubernetes Secret or ConfigMap volume replaced by swapping its ``..data`` symlink counts as a change, as
  does a rename into place or a rewrite) and, when they moved, builds a fresh ``ssl.SSLContext`` from them.
  A caller may add a version of its own (``version``: e.g. a watched ConfigMap's resourceVersion).
- A new pair that does not load (a half-written one: a key of another certificate, a truncated file) is
  logged as an error and the previous context keeps serving; it is tried again when the files move again.
- Connections already open keep the context of their handshake: nothing is dropped. A reload logs the
  certificate's subject, serial and expiry.

Two ways to serve it: a server that wraps each accepted connection itself calls ``current()`` per
connection; one that takes a single context for its listener (asyncio's ``create_server``) gets
``listening_context()``, whose handshakes switch to the current context as the client's hello arrives (the
server-name callback, called with or without SNI). Imports nothing of the product but ``file_stamps``.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Hashable

from cryptography import x509

from gpustack_models.file_stamps import file_stamps

log = logging.getLogger(__name__)


def describe(cert_file: str) -> str:
    """Subject, serial and expiry of the first certificate of ``cert_file``, for the logs."""
    try:
        with open(cert_file, "rb") as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
    except (OSError, ValueError) as exc:
        return f"{cert_file} (unreadable: {exc})"
    return (
        f"subject {cert.subject.rfc4514_string()}, serial {cert.serial_number:x}, "
        f"not after {cert.not_valid_after_utc.isoformat()}"
    )


def _trust(context: ssl.SSLContext) -> str:
    count = len(context.get_ca_certs())
    return f"; trusting {count} client CA certificate{'s' if count != 1 else ''}" if count else ""


class ServingTLS:
    """The current server context built by ``build()`` from ``cert_file``, ``key_file`` and the ``trusted``
    files (CA bundles), rebuilt when one of them (or ``version()``) changes. The first build must succeed:
    a server never starts without its certificate."""

    def __init__(
        self,
        name: str,
        cert_file: str,
        key_file: str,
        build: Callable[[], ssl.SSLContext],
        trusted: tuple[str, ...] = (),
        version: Callable[[], Hashable] | None = None,
    ):
        self.name, self.cert_file, self.key_file = name, cert_file, key_file
        self._files = (cert_file, key_file, *(path for path in trusted if path))
        self._build, self._version = build, version or (lambda: None)
        self._lock = threading.Lock()
        self._stamp = self.stamp()
        self._context = build()
        self.reloads = 0  # contexts built after the first
        log.info("%s: serving certificate %s%s", name, describe(cert_file), _trust(self._context))

    def stamp(self) -> tuple:
        return file_stamps(*self._files), self._version()

    def current(self) -> ssl.SSLContext:
        """The context for a new connection: rebuilt first when the files changed since the last build."""
        stamp = self.stamp()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp  # tried once per change: a broken pair is logged once, not per handshake
                    self._reload()
        return self._context

    def _reload(self) -> None:
        try:
            context = self._build()
        except Exception as exc:  # whatever the files hold, the server keeps serving
            log.error(
                "%s: the changed certificate, key or CA files do not load (%s); still serving the previous "
                "certificate until they change again",
                self.name,
                exc,
            )
            return
        self._context = context
        self.reloads += 1
        log.info(
            "%s: reloaded its certificate files; serving certificate %s%s",
            self.name,
            describe(self.cert_file),
            _trust(context),
        )

    def listening_context(self) -> ssl.SSLContext:
        """A context for a listener that takes one for all its connections: each handshake switches to
        ``current()`` when the client's hello arrives."""
        outer = self._build()
        outer.sni_callback = self._switch
        return outer

    def _switch(self, ssl_object, _server_name, context) -> None:
        try:
            current = self.current()
        except Exception:  # a version that cannot be read: this handshake keeps the context it has
            log.exception("%s: checking its certificate files", self.name)
            return
        if current is not context:
            ssl_object.context = current
