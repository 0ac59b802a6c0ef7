"""What ``helm test`` checks on an installed release (``manage.py checkinstall``, the chart's test hook).

- the APIService of the public API is Available and its discovery lists resources;
- a tenant identity is refused: a token requested for a ServiceAccount with no grants lists ModelArtifacts
  through the public API and must get a 403 ``Status``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpustack_models import kube
from gpustack_models.kinds import GROUP, PUBLIC_VERSION

API_SERVICE = f"{PUBLIC_VERSION}.{GROUP}"
TOKEN_SECONDS = 600


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def api_service_available(client: kube.Kube, name: str) -> Check:
    what = f"APIService {name} is Available"
    try:
        obj = client.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
    except kube.StatusError as exc:
        return Check(what, False, str(exc))
    conditions = (obj.get("status") or {}).get("conditions") or []
    available = next((c for c in conditions if c.get("type") == "Available"), {})
    detail = f"{available.get('status', 'Unknown')}: {available.get('reason', '')} {available.get('message', '')}"
    return Check(what, available.get("status") == "True", detail.strip())


def discovery_served(client: kube.Kube, group: str, version: str) -> Check:
    what = f"discovery of {group}/{version} lists resources"
    try:
        listed = client.get(f"/apis/{group}/{version}")
    except kube.StatusError as exc:
        return Check(what, False, str(exc))
    names = sorted(r["name"] for r in listed.get("resources") or [] if "/" not in r["name"])
    return Check(what, bool(names), ", ".join(names) or "no resource")


def identity(client: kube.Kube, token: str) -> kube.Kube:
    """A client for kube-apiserver with ``token`` alone (no client certificate of the caller)."""
    return kube.Kube(client.credentials.with_token(token), pool_size=1)


def tenant_refused(client: kube.Kube, namespace: str, account: str, group: str, version: str) -> Check:
    what = f"serviceaccount {namespace}/{account} may not list modelartifacts through {group}/{version}"
    try:
        review = client.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": TOKEN_SECONDS}},
        )  # fmt: skip
    except kube.StatusError as exc:
        return Check(what, False, f"requesting its token: {exc}")
    tenant = identity(client, review["status"]["token"])
    resp = tenant.request("GET", f"/apis/{group}/{version}/namespaces/{namespace}/modelartifacts")
    try:
        body = resp.json()
    except ValueError:
        body = {}
    refused = resp.status == 403 and body.get("kind") == "Status"
    return Check(what, refused, f"HTTP {resp.status}: {body.get('message', '') if refused else resp.data[:200]!r}")


def check_install(
    client: kube.Kube, namespace: str, tenant: str, api_service: str, say: Callable[[str], None]
) -> list[Check]:
    """Run every check, saying each; returns the failed ones."""
    version, group = api_service.split(".", 1)
    checks = [
        api_service_available(client, api_service),
        discovery_served(client, group, version),
        tenant_refused(client, namespace, tenant, group, version),
    ]
    for check in checks:
        say(f"{'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    return [c for c in checks if not c.ok]
