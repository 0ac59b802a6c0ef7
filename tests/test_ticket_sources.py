"""Whose hub tokens a fetch ticket carries, with the real worker and control plane: a tenant's token goes only
to the nodes where that tenant references the digest (a prefetch targeting the node, by name or by selector,
or a Pod there mounting it), never to a node that asks for a digest the tenant shares with others. The
nodes and their plugins' Pod-bound tokens are the mount endpoint's (``tests.support.mounts``)."""

from __future__ import annotations

import base64
import json
import uuid

from gpustack_models.kinds import GROUP
from tests.support import wait_for
from tests.support.cluster import fresh_namespace
from tests.support.mounts import STORAGE
from tests.support.pods import model_volume
from tests.support.stores import prefetch


def artifact(mounts, ns: str, name: str, repository: str, secret: str | None = None) -> str:
    """Create a ModelArtifact of ``repository`` (with ``secret``'s hub token); its digest once resolved."""
    source = {"repository": repository, **({"secretRef": {"name": secret}} if secret else {})}
    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": name},
            "spec": {"source": {"huggingFace": source}}}  # fmt: skip
    mounts.kube.create(f"{STORAGE}/namespaces/{ns}/modelartifacts", body)

    def digest():
        return ((mounts.artifact_object(name, ns).get("status") or {}).get("resolved") or {}).get("manifestDigest")

    return wait_for(digest, timeout=60, message=f"{ns}/{name} to resolve")


def ticket(mounts, node: str, digest: str) -> dict:
    resp = mounts.post({"node": node, "digest": digest}, token=mounts.tokens[node], path="tickets")
    assert resp.status_code == 200, resp.text
    return resp.json()


def offered(answer: dict) -> list[tuple[str, str | None]]:
    return [(s["repository"], s["token"]) for s in answer["sources"]]


def test_a_node_gets_no_hub_token_of_a_tenant_that_places_nothing_on_it(mounts, hub, core):
    """Tenant T (a private copy, with its token's Secret) places the digest on node Y only; tenant U (public,
    no token) places it on X. X's ticket carries no token of T, Y's does; once T references the digest on X
    too (a prefetch by selector, then a Pod's mount), X's ticket carries it."""
    x, y = mounts.nodes
    tag = uuid.uuid4().hex[:6]
    files = {"config.json": f"shared-{tag}".encode(), "model.safetensors": b"s" * 4096}
    public, private, token = f"org/pub-{tag}", f"org/priv-{tag}", f"hf_tenant_{uuid.uuid4().hex}"
    hub.add_hf_repo(public, files)
    hub.add_hf_repo(private, files, private=True, token=token)
    namespaces = fresh_namespace(core)
    tenant = next(namespaces)
    try:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hub-token"},
                  "data": {"token": base64.b64encode(token.encode()).decode()}}  # fmt: skip
        mounts.launcher.admin.create(f"/api/v1/namespaces/{tenant}/secrets", secret)
        digest = artifact(mounts, mounts.ns, "pub", public)
        assert artifact(mounts, tenant, "priv", private, secret="hub-token") == digest
        prefetch(mounts.kube, tenant, "on-y", "priv", [y])
        prefetch(mounts.kube, mounts.ns, "on-x", "pub", [x])
        for node in (x, y):
            wait_for(lambda node=node: mounts.item(digest, node), timeout=30, message=f"the digest placed on {node}")

        asked_by_x = ticket(mounts, x, digest)
        assert offered(asked_by_x) == [(public, None)]
        assert token not in json.dumps(asked_by_x), "a token of a tenant that placed nothing on the node"
        assert offered(ticket(mounts, y, digest)) == [(public, None), (private, token)], "token-less first"

        label = {f"tier-{tag}": "gpu"}
        mounts.launcher.admin.json("PATCH", f"/api/v1/nodes/{x}", body={"metadata": {"labels": label}},
                                   content_type="application/merge-patch+json")  # fmt: skip
        selected = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelPrefetch", "metadata": {"name": "selected"},
                    "spec": {"artifactRef": {"name": "priv"}, "nodeSelector": {"matchLabels": label}}}  # fmt: skip
        mounts.kube.create(f"{STORAGE}/namespaces/{tenant}/modelprefetches", selected)
        wait_for(lambda: (private, token) in offered(ticket(mounts, x, digest)), timeout=30,
                 message="the tenant's token on the node its prefetch selects")  # fmt: skip
        mounts.kube.delete(f"{STORAGE}/namespaces/{tenant}/modelprefetches/selected")
        wait_for(lambda: offered(ticket(mounts, x, digest)) == [(public, None)], timeout=30,
                 message="the tenant's token gone with its prefetch")  # fmt: skip

        pod = mounts.pod(ns=tenant, volumes=[model_volume("model", "priv")])
        assert mounts.post(mounts.body(pod, "priv")).status_code == 200
        assert offered(ticket(mounts, x, digest)) == [(public, None), (private, token)], "a Pod of the tenant mounts it"
    finally:
        next(namespaces, None)
