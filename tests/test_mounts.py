"""Mount references with the real worker (API process, Celery worker and beat) and the control plane: a node
plugin's mount request is authorized from the cluster (its bound token, the Pod, the artifact in the Pod's
namespace), places the digest on the node at once and protects the artifact; a release, a deleted Pod or a
deleted node ends it. Pods are created bound to a node (no kubelet runs them: they stay Pending, which is
all authorization needs), with the model volumes a tenant writes, and each mount names one of them by the
volume id the kubelet would give it (``tests.support.mounts``). The suite's worker checks mounts every 3 s,
with an 8 s collection grace and a cap of 16 digests per node."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.utils import timezone

from gpustack_models.kinds import GROUP
from gpustack_models.models import MOUNT_PROTECTION, Artifact
from tests.support import wait_for
from tests.support.cluster import fresh_namespace
from tests.support.mounts import STORAGE, assert_refused, insert_row, rows
from tests.support.pods import model_volume
from tests.support.stores import (
    assert_grace,
    cap_digests,
    cap_prefetches,
    fill_past_the_cap,
    node_full,
    prefetch,
    tenants_of,
)
from tests.support.worker import COLLECTION_GRACE, MODELS_PER_NODE


def kept_by_checks(node: str, since, count: int) -> None:
    """Wait for ``count`` mount checks after ``since`` (``timezone.now()``) that kept the one mount on ``node``:
    each check refreshes the ``last_seen`` of the mounts it keeps."""
    for _ in range(count):
        since = wait_for(
            lambda since=since: [r.last_seen for r in rows(node=node) if r.last_seen > since] or None,
            timeout=15,
            message=f"a mount check after {since} to keep the mount on {node}",
        )[0]
    assert len(rows(node=node)) == 1


def test_a_mount_places_its_digest_at_once_protects_the_artifact_and_a_release_lets_both_go(mounts):
    pod = mounts.pod(volumes=[model_volume("model", mounts.artifact, mounts.digest)])
    body = mounts.body(pod, expectedDigest=mounts.digest)
    resp = mounts.post(body)
    answered = time.monotonic()
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    size = mounts.artifact_object()["status"]["resolved"]
    assert answer == {
        "digest": mounts.digest,
        "namespace": mounts.ns,
        "artifact": mounts.artifact,
        "sizeBytes": size["sizeBytes"],
        "fileCount": size["fileCount"],
    }
    assert MOUNT_PROTECTION in mounts.finalizers(), "the finalizer is there before the answer"
    wait_for(lambda: mounts.item(mounts.digest), timeout=30, interval=0.05, message="the digest in spec.models")
    placing = time.monotonic() - answered
    assert mounts.item(mounts.digest) == {"digest": mounts.digest, "pinned": False}
    assert mounts.models(mounts.nodes[1]) == [], "placed on another node"
    (row,) = rows(node=mounts.node)
    meta = pod["metadata"]
    assert (row.volume_id, row.pod_namespace, row.pod_name, row.pod_uid, row.artifact, row.digest) == (
        body["volumeId"], meta["namespace"], meta["name"], meta["uid"], mounts.artifact, mounts.digest
    )  # fmt: skip
    assert row.size_bytes == size["sizeBytes"]

    again = mounts.post(body)  # the kubelet retries; the same volume is one reference
    assert again.status_code == 200 and again.json() == answer
    assert len(rows(node=mounts.node)) == 1 and mounts.finalizers().count(MOUNT_PROTECTION) == 1

    releasing, releasing_wall = time.monotonic(), time.time()
    released = mounts.release(body["volumeId"])
    answered = time.monotonic()
    assert (released.status_code, released.json()) == (200, {})
    assert rows(node=mounts.node) == []
    # The release reconciles the node through the same task: the baseline of the mount's "at once".
    item = wait_for(lambda: (it := mounts.item(mounts.digest)) and "collectTime" in it and it, timeout=30,
                    interval=0.05, message="a collectTime")  # fmt: skip
    baseline = time.monotonic() - answered
    assert placing < baseline + 2.0, f"the mounted digest took {placing:.1f} s to reach spec.models ({baseline:.1f} s)"
    assert_grace(item["collectTime"], releasing_wall, time.time())
    assert mounts.release(body["volumeId"]).status_code == 200, "a release is idempotent"
    wait_for(lambda: MOUNT_PROTECTION not in mounts.finalizers(), timeout=10, message="the finalizer lifted")
    wait_for(lambda: mounts.item(mounts.digest) is None, timeout=COLLECTION_GRACE + 20, message="the digest to go")
    assert time.monotonic() - releasing >= COLLECTION_GRACE, "left spec.models before the collection grace"


def _unresolvable(mounts, hub) -> str:
    """An artifact of a repository the hub does not have: resolution fails."""
    mounts.kube.create(
        f"{STORAGE}/namespaces/{mounts.ns}/modelartifacts",
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": "missing"},
         "spec": {"source": {"huggingFace": {"repository": f"org/none-{uuid.uuid4().hex[:6]}"}}}},
    )  # fmt: skip

    def failed():
        conds = (mounts.artifact_object("missing").get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Resolved" and c["status"] == "False"), None)

    return wait_for(failed, timeout=60, message="the resolution to fail")["reason"]


def _claim(mounts) -> None:
    mounts.kube.create(
        f"{STORAGE}/namespaces/{mounts.ns}/modelartifacts",
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": "volume"},
         "spec": {"source": {"persistentVolumeClaim": {"claimName": "models"}}}},
    )  # fmt: skip


def test_every_refusal_is_a_status_and_changes_nothing(mounts, hub, cluster, core):
    reason = _unresolvable(mounts, hub)
    _claim(mounts)
    other_node = mounts.nodes[1]
    zeros = "sha256:" + "0" * 64
    pod = mounts.pod(
        volumes=[
            model_volume("model", mounts.artifact),
            model_volume("missing", "missing"),
            model_volume("volume", "volume"),
            model_volume("zeros", mounts.artifact, zeros),
        ]
    )
    elsewhere = mounts.pod(node=other_node)
    gen = fresh_namespace(core)
    team_b = next(gen)
    try:
        outsider = mounts.pod(ns=team_b)
        wrong_uid = mounts.body(pod)
        wrong_uid["pod"]["uid"] = str(uuid.uuid4())
        gone = mounts.body(pod)
        gone["pod"]["name"] = "no-such-pod"
        cases = [
            # who asks
            (mounts.body(pod), None, 401, "Unauthorized"),
            (mounts.body(pod), "not-a-token", 401, "Unauthorized"),
            (mounts.body(pod), cluster.tokens()["erin"], 403, "is not the node plugin"),
            (mounts.body(pod), mounts.tokens[other_node], 403, f"bound to node {other_node}, not {mounts.node}"),
            # the Pod
            (wrong_uid, "", 404, f"pod {mounts.ns}/{pod['metadata']['name']} not found"),
            (gone, "", 404, f"pod {mounts.ns}/no-such-pod not found"),
            (mounts.body(elsewhere), "", 403, f"is not on node {mounts.node}"),
            # the artifact, in the Pod's namespace
            (mounts.body(outsider), "", 404, f"modelartifact {mounts.artifact} not found in namespace {team_b}"),
            (
                mounts.body(pod, "missing", volume="missing"),
                "",
                409,
                f"modelartifact missing is not resolved yet ({reason}: ",
            ),
            (
                mounts.body(pod, "volume", volume="volume"),
                "",
                400,
                "takes its files from a volume claim: mount the claim itself",
            ),
            (mounts.body(pod, volume="zeros", expectedDigest=zeros), "", 400, "does not match the digest"),
            # hostile bodies
            (mounts.body(pod, volumeId=5), "", 400, "volumeId must be"),
            (mounts.body(pod, volumeId="v" * 129), "", 400, "volumeId must be"),
            (mounts.body(pod, artifact="x" * 300_000), "", 400, "artifact must be"),
            (mounts.body(pod, artifact="../nodemodelstores/x"), "", 400, "artifact must be"),
            (mounts.body(pod, node="../../nodes"), "", 400, "node must be"),
            (dict(mounts.body(pod), pod=["x"]), "", 400, "pod must be an object"),
            ([mounts.body(pod)], "", 400, "JSON object"),
        ]
        for body, token, code, message in cases:
            assert_refused(mounts.post(body, token=token), code, message)
        in_name = mounts.body(pod)
        in_name["pod"]["name"] = "../kube-system/pods/x"
        assert_refused(mounts.post(in_name), 400, "pod.name must be")
        raw = mounts.post(None, data=b"{not json", headers={"Content-Type": "application/json"})
        assert raw.status_code == 400 and raw.json()["kind"] == "Status"
        assert_refused(mounts.post(None), 400, "node must be")  # no body at all: the first field missing
        # The release: the same token rules, and a body of the same shape.
        assert_refused(mounts.release("v", token=mounts.tokens[other_node]), 403, "bound to node")
        assert_refused(mounts.release("v", token=None), 401, "Unauthorized")
        assert_refused(mounts.post({"node": mounts.node, "volumeId": ""}, path="mounts/release"), 400, "volumeId")
        assert rows(node__in=mounts.nodes) == [], "a refused mount was recorded"
        for name in (mounts.artifact, "missing", "volume"):
            assert MOUNT_PROTECTION not in mounts.finalizers(name), name
        # Reconciles started after every refusal: neither node was asked for the digest.
        assert mounts.reconciled() == [] and mounts.reconciled(other_node) == []
        # A mount allowed after them is recorded, protected and placed (the same window, the same checks).
        allowed = mounts.body(pod)
        assert mounts.post(allowed).status_code == 200
        wait_for(lambda: mounts.item(mounts.digest), timeout=30, message="the allowed mount placed")
        assert [r.volume_id for r in rows(node__in=mounts.nodes)] == [allowed["volumeId"]]
        assert MOUNT_PROTECTION in mounts.finalizers()
    finally:
        next(gen, None)


def _phase(mounts, pod: dict, phase: str) -> dict:
    """``pod`` with its status phase set, as its kubelet would report it."""
    meta = pod["metadata"]
    return mounts.launcher.admin.json(
        "PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
        body={"status": {"phase": phase}}, content_type="application/merge-patch+json",
    )  # fmt: skip


def test_a_mount_its_pods_spec_does_not_ask_for_is_refused_and_changes_nothing(mounts):
    """The node's plugin token asks to mount the tenant's artifact for Pods of that tenant on that node that
    ask for no such mount: no model volume, one naming another artifact or another expectedDigest, a volume
    of another kind, a volume id of no volume of the Pod (made up, or another Pod's), a finished Pod."""
    art, ns = mounts.artifact, mounts.ns
    plain = mounts.pod(volumes=[])
    other = mounts.pod(volumes=[model_volume("model", "other-art"), {"name": "scratch", "emptyDir": {}}])
    pinned = mounts.pod(volumes=[model_volume("model", art, "sha256:" + "1" * 64)])
    unpinned, neighbour = mounts.pod(), mounts.pod()
    succeeded, failed = _phase(mounts, mounts.pod(), "Succeeded"), _phase(mounts, mounts.pod(), "Failed")

    def named(pod):
        return f"pod {ns}/{pod['metadata']['name']}"

    cases = [
        (mounts.body(plain), 403, f"is not the volume id of any volume of {named(plain)}"),
        (mounts.body(other), 403, f"volume model of {named(other)} does not name modelartifact {art}"),
        (mounts.body(other, volume="scratch"), 403, "is not a csi volume of driver model.csi.gpustack.ai"),
        (mounts.body(pinned), 403, f"has expectedDigest sha256:{'1' * 64}, not (none)"),
        (mounts.body(pinned, expectedDigest=mounts.digest), 403, f"not {mounts.digest}"),
        (mounts.body(unpinned, expectedDigest=mounts.digest), 403, f"has expectedDigest (none), not {mounts.digest}"),
        (dict(mounts.body(unpinned), volumeId=f"csi-{uuid.uuid4().hex}"), 403, "is not the volume id of any volume"),
        (dict(mounts.body(unpinned), volumeId=mounts.body(neighbour)["volumeId"]), 403, "is not the volume id of"),
        (mounts.body(succeeded), 409, f"{named(succeeded)} has finished (phase Succeeded)"),
        (mounts.body(failed), 409, f"{named(failed)} has finished (phase Failed)"),
    ]
    for body, code, message in cases:
        assert_refused(mounts.post(body), code, message)
    assert rows(node__in=mounts.nodes) == [], "a refused mount was recorded"
    assert MOUNT_PROTECTION not in mounts.finalizers(), "a refused mount protected the artifact"
    assert mounts.reconciled() == [] and mounts.models() == [], "a refused mount placed the digest"
    assert mounts.post(mounts.body(unpinned)).status_code == 200, "the Pod's own volume, as the kubelet names it"


def test_a_pod_being_deleted_mounts_again_what_it_mounted_and_nothing_new(mounts):
    """As the kubelet starts no new volume for a Pod whose termination has begun, and publishes again after a
    restart the volumes it had: a finalizer keeps the Pod in its deletion while no kubelet ends it."""
    pod = mounts.pod(volumes=[model_volume("a", mounts.artifact), model_volume("b", mounts.artifact)],
                     finalizers=["example.com/hold"])  # fmt: skip
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    first = mounts.body(pod, volume="a")
    assert mounts.post(first).status_code == 200
    mounts.launcher.admin.delete(path, query={"gracePeriodSeconds": "30"})
    try:
        assert mounts.launcher.admin.get(path)["metadata"].get("deletionTimestamp")
        assert_refused(mounts.post(mounts.body(pod, volume="b")), 409, "is being deleted: it mounts no new volume")
        assert mounts.post(first).status_code == 200, "a volume it recorded, published again"
        assert [r.volume_id for r in rows(node__in=mounts.nodes)] == [first["volumeId"]]
    finally:
        mounts.launcher.admin.json(
            "PATCH", path, body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
        )


def test_a_mount_recorded_for_a_volume_its_pod_does_not_have_ends_at_the_next_check(mounts):
    """A reference recorded before mounts were checked against the Pod's spec (written here as it could be
    then: a made-up volume id, for a Pod with no model volume) ends at the next mount check; a Pod's own
    volume, mounted beside it, stays."""
    bare, pod = mounts.pod(volumes=[]), mounts.pod()
    meta = bare["metadata"]
    insert_row(
        node=mounts.node, volume_id=f"csi-{uuid.uuid4().hex}", pod_namespace=meta["namespace"], pod_name=meta["name"],
        pod_uid=meta["uid"], artifact=mounts.artifact, digest=mounts.digest,
    )  # fmt: skip
    assert len(rows(node=mounts.node)) == 1
    own = mounts.body(pod)
    assert mounts.post(own).status_code == 200
    wait_for(lambda: [r.volume_id for r in rows(node=mounts.node)] == [own["volumeId"]], timeout=15,
             message="the mount check to end the reference its Pod's spec does not have")  # fmt: skip
    kept_by_checks(mounts.node, timezone.now(), 1)


def test_a_static_pod_mounts_nothing_and_a_pod_at_most_64_volumes(mounts):
    static = mounts.pod(annotations={"kubernetes.io/config.mirror": "node-made"})
    assert_refused(mounts.post(mounts.body(static)), 403, "is a static Pod")
    assert rows(node=mounts.node) == []
    pod = mounts.pod(volumes=[model_volume(f"v{i}", mounts.artifact) for i in range(65)])
    for i in range(64):
        resp = mounts.post(mounts.body(pod, volume=f"v{i}"))
        assert resp.status_code == 200, resp.text
    assert_refused(mounts.post(mounts.body(pod, volume="v64")), 409, "already mounts 64 model volumes")
    assert len(rows(node=mounts.node)) == 64
    assert mounts.post(mounts.body(pod, volume="v0")).status_code == 200, "a known volume again"


def test_an_artifact_being_deleted_is_not_mounted(mounts):
    mounts.kube.create(
        f"{STORAGE}/namespaces/{mounts.ns}/modelartifacts",
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact",
         "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
         "spec": {"source": {"huggingFace": {"repository": "org/whatever"}}}},
    )  # fmt: skip
    path = f"{STORAGE}/namespaces/{mounts.ns}/modelartifacts/held"
    mounts.kube.delete(path)
    try:
        held = mounts.pod(volumes=[model_volume("held", "held")])
        assert_refused(mounts.post(mounts.body(held, "held", volume="held")), 409, "modelartifact held in namespace")
        assert mounts.finalizers("held") == ["example.com/hold"]
        assert rows(node=mounts.node) == []
    finally:
        mounts.kube.json(
            "PATCH", path, body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
        )


def test_a_deleted_pod_ends_its_mount_and_a_deleted_artifact_waits_for_it(mounts):
    pod = mounts.pod()
    assert mounts.post(mounts.body(pod)).status_code == 200
    wait_for(lambda: mounts.item(mounts.digest), timeout=5, message="the digest in spec.models")
    # Deleting the artifact while a Pod mounts it waits for the Pod.
    mounts.kube.delete(f"{STORAGE}/namespaces/{mounts.ns}/modelartifacts/{mounts.artifact}")

    def deletion_mirrored():
        body = Artifact.objects.filter(namespace=mounts.ns, name=mounts.artifact).values_list("body", flat=True)
        return bool(((body.first() or {}).get("metadata") or {}).get("deletionTimestamp"))

    wait_for(deletion_mirrored, timeout=15, message="the worker to see the deletion")
    # Two mount checks since then kept the mount (what the first enqueued was done before the second: they
    # are 3 s apart), and a reconcile since keeps the digest.
    kept_by_checks(mounts.node, timezone.now(), 2)
    assert mounts.reconciled() == [{"digest": mounts.digest, "pinned": False}]
    obj = mounts.artifact_object()
    assert obj is not None and obj["metadata"].get("deletionTimestamp"), "deleted while mounted"
    assert obj["metadata"]["finalizers"] == [MOUNT_PROTECTION]
    # A new mount of it is refused while it is being deleted.
    assert_refused(mounts.post(mounts.body(mounts.pod())), 409, "is being deleted")
    mounts.delete_pod(pod)
    wait_for(lambda: rows(node=mounts.node) == [], timeout=15, message="the mount check to end the reference")
    wait_for(lambda: mounts.artifact_object() is None, timeout=15, message="the artifact to go")
    wait_for(lambda: (mounts.item(mounts.digest) or {}).get("collectTime"), timeout=10, message="a collectTime")


def test_a_deleted_node_ends_its_mounts(mounts):
    pod = mounts.pod()
    assert mounts.post(mounts.body(pod)).status_code == 200
    replaced = mounts.pod(node=mounts.nodes[1])
    assert mounts.post(mounts.body(replaced, node=mounts.nodes[1]), token=mounts.tokens[mounts.nodes[1]]).ok
    wait_for(lambda: mounts.item(mounts.digest, mounts.nodes[1]), timeout=5, message="placed on the second node")
    assert len(rows(node__in=mounts.nodes)) == 2
    mounts.launcher.unregister_node(mounts.node)  # its Pod stays, bound to a node that is gone
    wait_for(lambda: rows(node=mounts.node) == [], timeout=15, message="the reference on the deleted node to end")
    # A mount check after the one that ended it (checks are 3 s apart; a check keeps its mounts a moment
    # after it ends others) keeps the other node's mount, and the release that ending enqueued is done.
    kept_by_checks(mounts.nodes[1], timezone.now() + timedelta(seconds=1), 1)
    assert MOUNT_PROTECTION in mounts.finalizers(), "the artifact is still mounted on the other node"
    mounts.delete_pod(replaced)
    wait_for(lambda: MOUNT_PROTECTION not in mounts.finalizers(), timeout=15, message="the finalizer lifted")


def test_namespace_limits_do_not_limit_mounts(mounts, core):
    core.patch_namespace(mounts.ns, {"metadata": {"annotations": {f"{GROUP}/prefetch-bytes-per-node": "1"}}})
    prefetch(mounts.kube, mounts.ns, "warm", mounts.artifact, [mounts.node])

    def quota_exceeded():
        obj = mounts.kube.get(f"{STORAGE}/namespaces/{mounts.ns}/modelprefetches/warm")
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        return conds.get("Degraded", {}).get("reason") == "QuotaExceeded"

    wait_for(quota_exceeded, timeout=30, message="the prefetch QuotaExceeded")
    assert mounts.models() == []
    assert mounts.post(mounts.body(mounts.pod())).status_code == 200
    wait_for(lambda: mounts.item(mounts.digest), timeout=5, message="the mounted digest placed despite the limit")


def test_a_mount_keeps_its_place_under_the_cap_ahead_of_unpinned_prefetches(mounts, hub, core):
    """Two tenants prefetch four distinct digests more than the node's cap (the suite's worker: 16) onto one
    node: the cap's worth are placed, 4 NodeFull. A mount of another digest then takes a place: still the
    cap, the youngest placed prefetch is left out and none of those left out comes back."""
    count = MODELS_PER_NODE + 4
    tenants = tenants_of(core, -(-count // 10))
    namespaces = [ns for ns, _ in tenants]
    try:
        fill_past_the_cap(mounts.kube, hub, mounts.node, namespaces, count)
        full = wait_for(lambda: len(nf := node_full(cap_prefetches(mounts.kube, namespaces))) == 4 and nf,
                        timeout=120, interval=1, message="4 NodeFull")  # fmt: skip
        everything = {(namespaces[n // 10], f"p{n}") for n in range(count)}
        placed = cap_digests(mounts.kube, everything - full)
        assert len(placed) == MODELS_PER_NODE and mounts.digest not in placed
        wait_for(lambda: {m["digest"] for m in mounts.models()} == placed, timeout=30, message="the cap's worth placed")

        assert mounts.post(mounts.body(mounts.pod())).status_code == 200
        items = wait_for(lambda: len(node_full(items := cap_prefetches(mounts.kube, namespaces))) == 5 and items,
                         timeout=60, interval=1, message="5 NodeFull")  # fmt: skip
        after = node_full(items)
        assert full < after, "a prefetch left out came back"
        (displaced,) = after - full
        created = {key: items[key]["metadata"]["creationTimestamp"] for key in everything - after}
        assert items[displaced]["metadata"]["creationTimestamp"] >= max(created.values()), "not the youngest left out"
        expected = placed - cap_digests(mounts.kube, {displaced}) | {mounts.digest}
        wait_for(lambda: {m["digest"] for m in mounts.models()} == expected, timeout=30,
                 message="the mounted digest in place of the youngest prefetch")  # fmt: skip
        assert mounts.item(mounts.digest) == {"digest": mounts.digest, "pinned": False}
    finally:
        for _, gen in tenants:
            next(gen, None)
        _settled(namespaces)


def _settled(namespaces):
    """Wait for the worker to digest the teardown, so the next test's waits measure its own work."""
    from gpustack_models.models import Prefetch

    wait_for(lambda: not Prefetch.objects.live().filter(namespace__in=namespaces).exists(), timeout=120, interval=1,
             message="the worker to finish the teardown")  # fmt: skip


def test_the_worker_may_get_any_pod_by_name_and_nothing_more_on_tenants_pods(cluster, kubectl, launcher):
    from django.conf import settings

    sa = f"system:serviceaccount:{settings.NAMESPACE}:{settings.SERVICE_ACCOUNT}"
    for verb, allowed in (("get", "yes"), ("list", "no"), ("watch", "no"), ("delete", "no"), ("patch", "no")):
        out = kubectl("auth", "can-i", verb, "pods", "-n", "tenant-x", f"--as={sa}", check=False).stdout.strip()
        assert out == allowed, (verb, out)
    out = kubectl("auth", "can-i", "patch", f"modelartifacts.{GROUP}", "-n", "tenant-x", f"--as={sa}", check=False)
    assert out.stdout.strip() == "yes", "the protection finalizer"
