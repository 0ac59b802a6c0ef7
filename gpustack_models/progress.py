"""The ``progress`` subresource of a ModelArtifact: how far its content is across the cluster, now.

Computed per request and never written: the artifact (read from kube-apiserver), the mirror's entries for
its digest (every node, every namespace: counts of content cross namespaces, nothing else does), then the
live bytes of at most ``PROGRESS_LIVE_MAX`` downloading nodes, read from their plugins in parallel
(``GET /model/downloads`` with the worker's token, each within ``PROGRESS_LIVE_TIMEOUT``). A node past the
cap, or silent in time, contributes the bytes its store last reported and is not counted in ``live``.
The answer names no node.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import Counter
from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpResponse

from . import kube
from .models import PluginPod, StoreEntry

_sessions: dict = {}


def _zeros(name: str, namespace: str, reason: str, digest: str = "", size: int = 0) -> dict:
    return {
        "kind": "ModelArtifactProgress",
        "apiVersion": "worker.gpustack.ai/v1",
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
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        context = ssl.create_default_context(cafile=settings.PLUGIN_CA_FILE) if settings.PLUGIN_CA_FILE else False
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=0, keepalive_timeout=60), trust_env=False
        )
        _sessions[loop] = session
    return session


async def read_live(endpoints: dict[str, str], digest: str, timeout: float) -> dict[str, int]:
    """node -> downloadedBytes of ``digest`` from each plugin that answered within ``timeout``."""
    import aiohttp

    session = _plugin_session()
    headers = kube.worker().auth_headers()
    per_request = aiohttp.ClientTimeout(total=timeout)

    async def one(node: str, ip: str):
        host = f"[{ip}]" if ":" in ip else ip
        try:
            async with session.get(
                f"https://{host}:{settings.PLUGIN_PORT}/model/downloads", headers=headers, timeout=per_request
            ) as resp:
                if resp.status != 200:
                    return node, None
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError):
            return node, None
        for item in body.get("downloads") or []:
            if item.get("digest") == digest:
                return node, int(item.get("downloadedBytes") or 0)
        return node, None

    results = await asyncio.gather(*(one(node, ip) for node, ip in endpoints.items()))
    return {node: value for node, value in results if value is not None}


def compute(name: str, namespace: str, artifact: dict) -> dict:
    started = time.monotonic()
    spec, status = artifact.get("spec") or {}, artifact.get("status") or {}
    if "persistentVolumeClaim" in (spec.get("source") or {}):
        return _zeros(name, namespace, "ClaimSource")
    resolved = status.get("resolved") or {}
    digest = resolved.get("manifestDigest")
    if not digest:
        return _zeros(name, namespace, "NotResolved")
    out = _zeros(name, namespace, "", digest, resolved.get("sizeBytes") or 0)
    downloading: dict[str, tuple[int, int]] = {}  # node -> (size, stored bytes)
    reasons: Counter = Counter()
    rows = StoreEntry.objects.filter(digest=digest, store__deleted=False).values_list(
        "node", "state", "size_bytes", "downloaded_bytes", "reason"
    )
    for node, state, size, done, reason in rows:
        if state == "Ready":
            out["ready"] += 1
        elif state == "Downloading":
            downloading[node] = (size or out["sizeBytes"], done)
        elif state == "Failed":
            out["failed"] += 1
            reasons[reason or "Unknown"] += 1
    out["downloading"] = len(downloading)
    out["failureReasons"] = [{"reason": r, "count": c} for r, c in sorted(reasons.items())]
    live: dict[str, int] = {}
    if downloading:
        chosen = sorted(downloading)[: settings.PROGRESS_LIVE_MAX]
        endpoints = dict(
            PluginPod.objects.live()
            .filter(node__in=chosen, ready=True)
            .exclude(pod_ip="")
            .values_list("node", "pod_ip")
        )
        remaining = settings.PROGRESS_DEADLINE - (time.monotonic() - started)
        budget = min(settings.PROGRESS_LIVE_TIMEOUT, remaining - 0.5)
        if endpoints and budget > 0:
            live = async_to_sync(read_live)(endpoints, digest, budget)
    total_bytes, percents = 0, []
    for node, (size, stored) in downloading.items():
        done = live.get(node, stored)
        total_bytes += done
        percents.append(min(100, int(done * 100 / size)) if size else 0)
    out["downloadingBytes"] = total_bytes
    out["live"] = len(live)
    if percents:
        out["downloadingPercent"] = int(sum(percents) / len(percents))
    return out


def progress_response(view, request) -> HttpResponse:
    resp = kube.worker().request("GET", view.upstream_path())
    if resp.status != 200:
        return view.passthrough(resp)
    body = compute(view.name, view.namespace, resp.json())
    return HttpResponse(json.dumps(body), content_type="application/json")
