"""The ``progress`` subresource of a ModelArtifact: how far its content is across the cluster, now.

Computed per request and never written: the artifact (read from kube-apiserver), the mirror's entries for
its digest on the nodes it was placed on (``claimed``: a node's report of a digest it was never given counts
for nothing; every namespace: counts of content cross namespaces, nothing else does), then the live bytes
of at most ``PROGRESS_LIVE_MAX`` downloading nodes, read from their plugins in parallel (``GET
/model/downloads`` with the service's client certificate, ``plugin_client``, each within
``PROGRESS_LIVE_TIMEOUT``; no token is ever sent to a node). A node past the cap, or silent in time,
contributes the bytes its store last reported and is not counted in ``live``. The answer names no node.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from django.conf import settings
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.api.authorization import ResourceAttributes
from gpustack_models.api.plugin_client import service_client
from gpustack_models.api.renderers import PROGRESS_RENDERERS
from gpustack_models.api.targets import Query, Target
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kinds import GROUP, MODEL_ARTIFACT, PUBLIC_VERSION
from gpustack_models.kube.client import forget_closed_loops
from gpustack_models.kube.errors import MethodNotAllowed
from gpustack_models.models import EntryState, Holding, PluginPod, StoreEntry

_sessions: dict = {}

log = logging.getLogger(__name__)


def _zeros(name: str, namespace: str, reason: str, digest: str = "", size: int = 0) -> dict:
    return {
        "kind": "ModelArtifactProgress",
        "apiVersion": f"{GROUP}/{PUBLIC_VERSION}",
        "metadata": {"name": name, "namespace": namespace},
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "manifestDigest": digest,
        "sizeBytes": size,
        "ready": 0,
        "downloading": 0,
        "failed": 0,
        "downloadingBytes": 0,
        "live": 0,
        "failureReasons": [],
        **({"reason": reason} if reason else {}),
    }


def _plugin_session():
    """This loop's session to the plugins, built again when the service's client certificate is renewed
    (the old one is closed once its requests had time to end)."""
    import aiohttp

    context = service_client.context(settings.PLUGIN_CA_FILE, settings.PLUGIN_CA_KEY_FILE)
    loop = asyncio.get_running_loop()
    session, used = _sessions.get(loop, (None, None))
    if session is None or session.closed or used is not context:
        if session is not None and not session.closed:
            loop.call_later(2 * settings.PROGRESS_DEADLINE, lambda old=session: loop.create_task(old.close()))
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=0, keepalive_timeout=60), trust_env=False
        )
        forget_closed_loops(_sessions)
        _sessions[loop] = (session, context)
    return session


async def read_live(endpoints: dict[str, str], digest: str, timeout: float) -> dict[str, tuple[int, int]]:
    """node -> (downloadedBytes, bytesPerSecond) of ``digest`` from each plugin that answered within ``timeout``."""
    import aiohttp

    try:
        session = _plugin_session()
    except (OSError, ValueError, ssl.SSLError) as exc:  # no plugin CA, or no key: no node can be read live
        log.warning("not reading plugins live: the plugin CA (%s) cannot be loaded: %s", settings.PLUGIN_CA_FILE, exc)
        return {}
    per_request = aiohttp.ClientTimeout(total=timeout)

    async def one(node: str, ip: str):
        host = f"[{ip}]" if ":" in ip else ip
        try:
            async with session.get(
                f"https://{host}:{settings.PLUGIN_PORT}/model/downloads", timeout=per_request
            ) as resp:
                if resp.status != 200:
                    return node, None
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError):
            return node, None
        for item in body.get("downloads") or []:
            if item.get("digest") == digest:
                return node, (_count(item.get("downloadedBytes")), _count(item.get("bytesPerSecond")))
        return node, None

    results = await asyncio.gather(*(one(node, ip) for node, ip in endpoints.items()))
    return {node: value for node, value in results if value is not None}


def _count(value) -> int:
    """A non-negative integer a plugin sent; anything else reads as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Tally:
    """What the mirror says of one digest: counts, failure reasons, and each downloading node's
    (size, stored bytes)."""

    ready: int = 0
    failed: int = 0
    reasons: Counter = field(default_factory=Counter)
    downloading: dict[str, tuple[int, int]] = field(default_factory=dict)


def tally(digest: str, default_size: int) -> Tally:
    """The digest's ``claimed`` entries, read as two lists, its entries and the nodes it is placed on, matched
    here: as one query, PostgreSQL joined them by comparing every entry with every holding whenever its
    statistics predate the digest's rows (a new cluster, a model just rolled out to every node), quadratic
    in the nodes (``tests/test_query_plans.py``)."""
    out = Tally()
    placed = set(Holding.objects.filter(digest=digest).values_list("node", flat=True))
    rows = StoreEntry.objects.filter(digest=digest).values_list(
        "node", "state", "size_bytes", "downloaded_bytes", "reason"
    )
    for node, state, size, done, reason in rows:
        if node not in placed:
            continue  # a node's report of a digest never placed on it counts for nothing
        if state == EntryState.READY:
            out.ready += 1
        elif state == EntryState.DOWNLOADING:
            out.downloading[node] = (size or default_size, done)
        elif state == EntryState.FAILED:
            out.failed += 1
            out.reasons[reason or "Unknown"] += 1
    return out


def live_bytes(digest: str, downloading: dict, started: float) -> dict[str, tuple[int, int]]:
    """node -> live (downloaded bytes, bytes per second), for at most ``PROGRESS_LIVE_MAX`` downloading nodes
    that answer in time."""
    chosen = sorted(downloading)[: settings.PROGRESS_LIVE_MAX]
    endpoints = dict(
        PluginPod.objects.live().filter(node__in=chosen, ready=True).exclude(pod_ip="").values_list("node", "pod_ip")
    )
    remaining = settings.PROGRESS_DEADLINE - (time.monotonic() - started)
    budget = min(settings.PROGRESS_LIVE_TIMEOUT, remaining - 0.5)
    if not endpoints or budget <= 0:
        return {}
    return async_to_sync(read_live)(endpoints, digest, budget)


def compute(name: str, namespace: str, artifact: dict) -> dict:
    """The progress answer for ``artifact`` (a storage object)."""
    started = time.monotonic()
    spec, status = artifact.get("spec") or {}, artifact.get("status") or {}
    if "persistentVolumeClaim" in (spec.get("source") or {}):
        return _zeros(name, namespace, "ClaimSource")
    resolved = status.get("resolved") or {}
    digest = resolved.get("manifestDigest")
    if not digest:
        return _zeros(name, namespace, "NotResolved")
    out = _zeros(name, namespace, "", digest, resolved.get("sizeBytes") or 0)
    counts = tally(digest, out["sizeBytes"])
    live = live_bytes(digest, counts.downloading, started) if counts.downloading else {}
    out.update(ready=counts.ready, failed=counts.failed, downloading=len(counts.downloading), live=len(live))
    out["failureReasons"] = [{"reason": r, "count": c} for r, c in sorted(counts.reasons.items())]
    total_bytes, percents, rates, etas = 0, [], 0, []
    for node, (size, stored) in counts.downloading.items():
        done, rate = live.get(node, (stored, 0))
        total_bytes += done
        percents.append(min(100, int(done * 100 / size)) if size else 0)
        rates += rate
        etas.append(max(0, size - done) / rate if rate else None)
    out["downloadingBytes"] = total_bytes
    if percents:
        out["downloadingPercent"] = int(sum(percents) / len(percents))
    if live:
        out["bytesPerSecond"] = rates
    if etas and None not in etas:  # every downloading node read live and moving: when the last one ends
        out["etaSeconds"] = int(max(etas) + 0.999)
    return out


class ProgressView(KubeAPIView):
    """``GET .../namespaces/<ns>/modelartifacts/<name>/progress``: needs ``get`` on ``modelartifacts/progress``.

    Answers the object, or a one-row Table (``kubectl get mart <name> --subresource=progress``)."""

    renderer_classes = list(PROGRESS_RENDERERS)
    subresource = "progress"

    def initial(self, request, *args, **kwargs):
        self.target = Target.checked(MODEL_ARTIFACT, kwargs["namespace"], kwargs["name"])
        self.query = Query.of(request)
        super().initial(request, *args, **kwargs)

    def authorization_attributes(self, request):
        watching = self.query.watch
        verb = "watch" if watching and request.method in ("GET", "HEAD") else _VERBS.get(request.method, "get")
        return ResourceAttributes(
            verb=verb,
            group=GROUP,
            version=PUBLIC_VERSION,
            resource=MODEL_ARTIFACT.plural,
            namespace=self.target.namespace,
            name=self.target.name,
            subresource=self.subresource,
        )

    def get(self, request, **kwargs):
        if self.query.watch:
            raise MethodNotAllowed(f"watch is not supported on modelartifacts/{self.subresource}")
        artifact = kube.default().request("GET", self.target.storage_path()).raise_for_status().json()
        return Response(self.answer(artifact))

    def answer(self, artifact: dict) -> dict:
        return compute(self.target.name, self.target.namespace, artifact)

    def http_method_not_allowed(self, request, *args, **kwargs):
        verb = _VERBS.get(request.method, request.method.lower())
        raise MethodNotAllowed(f"{verb} is not supported on modelartifacts/{self.subresource}")


_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
