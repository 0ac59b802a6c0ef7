"""Fetch tickets: what a node plugin needs to download a digest (the manifest's files, and every source
of them: source, endpoint, repository, commit and hub token, if any).

Answered only to a plugin whose Pod-bound ServiceAccount token is bound to the node it names (TokenReview:
the plugin's ServiceAccount and ``authentication.kubernetes.io/node-name``), and only for a digest in that
node's ``spec.models`` (read live from kube-apiserver). Not part of the aggregated API: plugins call the
API's Service directly.

A digest names its files, whoever resolved them: every live artifact with that digest is a source of
them, and the ticket offers them, in the order the plugin tries them (it falls through to the next on a
refusal or an unavailable hub: one tenant's source refused or gone fails no one's download):

1. the sources without a token (public repositories), the referencing tenants' first;
2. the sources with the token of a tenant that references the digest on the asking node: a ModelPrefetch
   of that namespace, of an artifact with the digest, targets the node (by name or by selector) and no
   reconcile left it out or lapsed it there, or a Pod of that namespace on the node mounts an artifact of
   it with the digest.

A source with the token of any other tenant is not offered at all (its Secret is not even read): a
tenant's hub token travels only to the nodes where that tenant placed the content, so one node cannot
collect the tokens of tenants who never placed anything on it by asking for digests they share. A digest
in the node's ``spec.models`` whose every source is such a source has no ticket (409) while no tenant of
it references it there.

Within each group, the most recently resolved first. A source is offered once (same source, endpoint,
repository, commit and token). A Secret that is gone or holds no usable token leaves its source
token-less.

It also lists the other nodes' plugins that hold the digest (``peers``, whose endpoints are described in
``gpustack_models.plugin.peers.contract``): from the mirror, the nodes whose store entry of the digest is Ready,
then, when ``GPUSTACK_PEER_DOWNLOADING_ALLOWED``, those Downloading it and those it is placed on that
report nothing of it yet (listed as Downloading: they hold nothing yet, but they will); never the asking
node; only nodes with a Ready plugin Pod (reached at its Pod IP and ``GPUSTACK_PLUGIN_PEER_PORT``); shuffled within each
state so that the load spreads; at most ``GPUSTACK_TICKET_PEERS_MAX``. No peer port (0): no peers.

``joining`` counts the other nodes that are to start downloading the digest but are not among the candidates
for ``peers`` yet: a live prefetch of an artifact with this digest targets them (its target neither lapsed
nor left out), a Pod's volume there mounts it, it is placed there or they report it Downloading, and they
have no Ready plugin Pod yet or no reconcile has placed it there yet. A plugin that finds no Ready peer
waits a moment for them before asking the hub (``gpustack_models.plugin.peers.swarm``), and only then: nodes
that report the digest Ready or Failed are not starting, and a node alone, or whose ticket could list every
node starting beside it (the ``GPUSTACK_TICKET_PEERS_MAX`` cap aside), has nobody to wait for. 0 also when
Downloading nodes are never listed (no peer port, or ``GPUSTACK_PEER_DOWNLOADING_ALLOWED`` off). The answer::

    {"digest", "files": [...], "proxy",
     "source", "endpoint", "repository", "commit", "token",   # the first source, as single-source readers expect
     "sources": [{"source", "endpoint", "repository", "commit", "token"}, ...],   # all of them, in order
     "peers": [{"node", "url": "https://<Pod IP>:<peer port>", "state": "Ready"|"Downloading"}, ...],
     "joining": <number of nodes>}
"""

from __future__ import annotations

import base64
import ipaddress
import random
from collections.abc import Iterable

from django.conf import settings
from django.db.models import F
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.api.authentication import TokenReviewAuthentication
from gpustack_models.api.views import KubeAPIView
from gpustack_models.internal import source_credentials
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kube.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from gpustack_models.kube.identity import NODE_NAME_EXTRA, plugin_user
from gpustack_models.models import (
    Artifact,
    EntryState,
    Holding,
    Manifest,
    MountReference,
    PluginPod,
    Prefetch,
    PrefetchTarget,
    Resolution,
    SourceKind,
    StoreEntry,
    TargetState,
)


class BoundPlugin(BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None:
            raise Unauthorized("Unauthorized")
        if user.username != plugin_user():
            raise Forbidden(f'User "{user.username}" is not the node plugin')
        return True


class TicketView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]

    def post(self, request):
        body = request.data
        node, digest = body.get("node"), body.get("digest")
        if not isinstance(node, str) or not isinstance(digest, str):
            raise BadRequest("expected a JSON body {node, digest}")
        bound = request.user.extra_dict.get(NODE_NAME_EXTRA) or []
        if bound != [node]:
            raise Forbidden(f"this token is bound to node {bound[0] if bound else '(none)'}, not {node}")
        check_wanted(node, digest)
        rows = resolutions(digest)
        manifest = Manifest.objects.filter(digest=digest).first()
        if not rows or manifest is None:
            raise Conflict(f"no resolved artifact provides {digest} yet")
        sources = offered_sources(ordered(rows, wanting_namespaces(node, digest, rows)))
        if not sources:
            raise Conflict(
                f"no source of {digest} may be offered to node {node}: each holds the hub token of a namespace"
                " that places nothing of it there"
            )
        peers, joining = peer_sources(node, digest)
        ticket = {
            "digest": digest,
            **sources[0],
            "files": manifest.files,
            "proxy": settings.HUB_PROXY or None,
            "sources": sources,
            "peers": peers,
            "joining": joining,
        }
        return Response(ticket)


def peer_sources(node: str, digest: str) -> tuple[list[dict], int]:
    """The ticket's ``peers`` and ``joining`` (see the module's docstring)."""
    port, cap = settings.PLUGIN_PEER_PORT, settings.TICKET_PEERS_MAX
    if not port or cap <= 0:
        return [], 0
    by_state, settled, placed = _holders(node, digest)
    nodes = {n for group in by_state.values() for n in group}
    pods = PluginPod.objects.live().filter(node__in=nodes, ready=True).exclude(pod_ip="")
    addresses = {pod_node: ip for pod_node, ip in pods.values_list("node", "pod_ip") if _is_ip(ip)}
    out = []
    for state, group in by_state.items():
        group = [n for n in group if n in addresses]
        random.shuffle(group)
        out += [{"node": n, "url": _peer_url(addresses[n], port), "state": str(state)} for n in group]
    if not settings.PEER_DOWNLOADING_ALLOWED:
        return out[:cap], 0  # nodes starting beside the asking one are never listed: nobody to wait for
    starting = (_wanting(node, digest) | placed | set(by_state[EntryState.DOWNLOADING])) - settled
    return out[:cap], len(starting - addresses.keys())


def _holders(node: str, digest: str) -> tuple[dict[str, list[str]], set[str], set[str]]:
    """The other nodes by state of the digest, among those it was placed on (a node's report of a digest
    it was never given offers it as nobody's peer): Ready, then (when allowed) Downloading, which counts the
    nodes it was placed on that report nothing of it yet (they start beside the asking node: knowing
    each other from the first ticket, they share the hub's work from the first byte); the other nodes
    that report it Ready or Failed (none of them is starting); those it is placed on."""
    states = [EntryState.READY] + ([EntryState.DOWNLOADING] if settings.PEER_DOWNLOADING_ALLOWED else [])
    by_state: dict[str, list[str]] = {state: [] for state in states}
    reported, settled = set(), set()
    claims = StoreEntry.objects.claimed().filter(digest=digest).exclude(node=node)
    for other, state in claims.values_list("node", "state"):
        reported.add(other)
        if state in by_state:
            by_state[state].append(other)
        if state != EntryState.DOWNLOADING:
            settled.add(other)
    placed = set(
        Holding.objects.filter(digest=digest, collect_time__isnull=True)
        .exclude(node=node)
        .values_list("node", flat=True)
    )
    if settings.PEER_DOWNLOADING_ALLOWED:
        by_state[EntryState.DOWNLOADING] += [n for n in placed if n not in reported]
    return by_state, settled, placed


def _wanting(node: str, digest: str) -> set[str]:
    """The other nodes something asks to hold ``digest``, placed there or not yet: the targets of live
    prefetches of an artifact with this digest that no reconcile left out or lapsed, and the nodes of
    Pods' volumes that mount it."""
    keys = set(
        Artifact.objects.live().filter(digest=digest).exclude(source=SourceKind.CLAIM).values_list("namespace", "name")
    )
    if not keys:
        return set()
    namespaces, names = {ns for ns, _ in keys}, {name for _, name in keys}
    prefetches = Prefetch.objects.live().filter(namespace__in=namespaces, artifact_name__in=names)
    ids = [pk for pk, ns, name in prefetches.values_list("pk", "namespace", "artifact_name") if (ns, name) in keys]
    targeted = PrefetchTarget.objects.filter(
        prefetch_id__in=ids, lapsed_at__isnull=True, state__in=[TargetState.PENDING, TargetState.HELD]
    ).exclude(node=node)
    mounted = MountReference.objects.filter(pod_namespace__in=namespaces, artifact__in=names, digest=digest).exclude(
        node=node
    )
    return set(targeted.values_list("node", flat=True)) | set(mounted.values_list("node", flat=True))


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _peer_url(ip: str, port: int) -> str:
    return f"https://[{ip}]:{port}" if ":" in ip else f"https://{ip}:{port}"


def check_wanted(node: str, digest: str) -> None:
    """Refuse unless ``digest`` is in the ``spec.models`` of ``node``'s NodeModelStore."""
    try:
        store = kube.default().get(f"/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores/{node}")
    except kube.NotFound:
        raise NotFound(f"no NodeModelStore for node {node}") from None
    wanted = {m.get("digest") for m in (store.get("spec") or {}).get("models") or []}
    if digest not in wanted:
        raise Forbidden(f"{digest} is not in the spec.models of node {node}")


def resolutions(digest: str) -> list[Resolution]:
    """The resolutions of every live artifact with this content: each a source of its files (computed for
    that very object: one recreated under the same name has a uid of its own)."""
    return list(
        Resolution.objects.select_related("artifact")
        .filter(manifest_id=digest, artifact__deleted=False, artifact__digest=digest, artifact__uid=F("artifact_uid"))
        .only(
            "artifact",
            "source",
            "endpoint",
            "repository",
            "commit",
            "secret_name",
            "objects_pinned",
            "resolved_at",
            "artifact__namespace",
            "artifact__name",
        )
    )


def wanting_namespaces(node: str, digest: str, rows: Iterable[Resolution]) -> set[str]:
    """The namespaces that reference ``digest`` on ``node`` through one of the artifacts of ``rows``: a live
    prefetch targets the node (its target row neither left out nor lapsed), or a Pod's volume there mounts it."""
    artifacts = {(r.artifact.namespace, r.artifact.name) for r in rows}
    namespaces, names = {ns for ns, _ in artifacts}, {name for _, name in artifacts}
    targets = PrefetchTarget.objects.filter(
        node=node,
        lapsed_at__isnull=True,
        state__in=[TargetState.PENDING, TargetState.HELD],
        prefetch__deleted=False,
        prefetch__namespace__in=namespaces,
        prefetch__artifact_name__in=names,
    ).values_list("prefetch__namespace", "prefetch__artifact_name")
    mounts = MountReference.objects.filter(
        node=node, digest=digest, pod_namespace__in=namespaces, artifact__in=names
    ).values_list("pod_namespace", "artifact")
    return {ns for ns, name in [*targets, *mounts] if (ns, name) in artifacts}


def ordered(rows: Iterable[Resolution], wanting: set[str]) -> list[Resolution]:
    """``rows`` that may be offered, in the order to try them (see the module's docstring): no row with a
    Secret of a namespace outside ``wanting``."""

    def rank(r: Resolution):
        theirs = r.artifact.namespace in wanting
        return bool(r.secret_name), not theirs, -r.resolved_at.timestamp(), r.artifact.namespace, r.artifact.name

    return sorted((r for r in rows if not r.secret_name or r.artifact.namespace in wanting), key=rank)


def offered_sources(rows: Iterable[Resolution]) -> list[dict]:
    """The ticket's ``sources``: each row's, with the token of its Secret (an S3 row: pre-signed links of its
    objects instead), duplicates once."""
    tokens: dict[tuple[str, str, str], str | None] = {}
    out, seen = [], set()
    for r in rows:
        source = {"source": r.source, "endpoint": r.endpoint, "repository": r.repository, "commit": r.commit}
        if r.source == SourceKind.S3:
            links = source_credentials.object_links(r.artifact.namespace, r.secret_name, r)
            key = (*source.values(), tuple(sorted(links.items())))
            if links and key not in seen:
                seen.add(key)
                out.append(dict(source, token=None, links=links))
            continue
        token = None
        if r.secret_name:
            where = (r.artifact.namespace, r.secret_name, r.endpoint if r.source == SourceKind.OCI else "")
            if where not in tokens:
                tokens[where] = source_credentials.registry_token(*where) if where[2] else hub_token(*where[:2])
            token = tokens[where]
        extents = (r.objects_pinned or {}).get("files") if r.source == SourceKind.OCI else None
        key = (*source.values(), token, repr(extents))
        if key not in seen:
            seen.add(key)
            out.append(dict(source, token=token, **({"extents": extents} if extents else {})))
    return out


def hub_token(namespace: str, secret_name: str) -> str | None:
    """The key ``token`` of the Secret, if it is there and a token a plugin accepts."""
    try:
        secret = kube.default().get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}")
    except kube.StatusError:
        return None
    raw = (secret.get("data") or {}).get("token")
    try:
        token = base64.b64decode(raw).decode().strip() if raw else None
    except (TypeError, ValueError):  # not base64, not UTF-8
        return None
    return token if token and source_credentials.TOKEN.fullmatch(token) else None
