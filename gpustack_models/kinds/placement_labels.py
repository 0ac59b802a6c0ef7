"""The Node labels of placement without a client certificate (``GPUSTACK_PLACEMENT_MODE=nodeLabels``).

Where kube-apiserver cannot present a client certificate to admission webhooks (managed control planes),
the Celery worker labels each Node with one label per artifact whose digest the node holds Ready, and the
placement webhook, unauthenticated there, prefers those labels. Both sides compute the label from the
artifact's namespace and name alone, with this function, so the webhook reads nothing to answer.

The key is ``artifacts.worker.gpustack.ai/<the first 40 hex digits of sha256("<namespace>/<name>")>``
(a namespace name holds no ``/``, so the input names one artifact); its value is ``Ready``. The hash hides
names from a casual reader of Nodes, not from someone who guesses them: whoever may read Nodes can test
whether a guessed namespace and name is held on a node.
"""

from __future__ import annotations

import hashlib
import re

LABEL_PREFIX = "artifacts.worker.gpustack.ai"
LABEL_VALUE = "Ready"
HASH_HEX = 40
# A label key's prefix is a DNS subdomain (at most 253 characters); its name at most 63 characters of
# alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def label_key(namespace: str, name: str) -> str:
    """The label a Node holding ``namespace/name`` Ready carries."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()
    return f"{LABEL_PREFIX}/{digest[:HASH_HEX]}"


def is_placement_label(key: str) -> bool:
    """A label key this mode writes (and owns: nothing else is to set one)."""
    return isinstance(key, str) and key.startswith(LABEL_PREFIX + "/")


def placement_labels(labels: dict | None) -> dict[str, str]:
    """The placement labels among a Node's ``labels``."""
    return {k: v for k, v in (labels or {}).items() if is_placement_label(k)}


def valid_label_key(key: str) -> bool:
    """Whether ``key`` is a valid qualified label key (``prefix/name``)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))
