"""What a node may read of the chart's release: the Secrets each Pod spec references (the Node authorizer
lets a kubelet read every Secret a Pod bound to its node references, whole) and which of the chart's Secrets
hold a private key."""

from __future__ import annotations

import base64
import re


def pod_specs(node, owner: str = "") -> list[tuple[str, dict]]:
    """Every Pod spec in ``node`` (a workload's template, a Job's, a CronJob's, a Pod's), by its object."""
    if isinstance(node, list):
        return [found for item in node for found in pod_specs(item, owner)]
    if not isinstance(node, dict):
        return []
    if "kind" in node and "metadata" in node:
        owner = f"{node['kind']}/{node['metadata']['name']}"
    if isinstance(node.get("containers"), list):
        return [(owner, node)]
    return [found for value in node.values() for found in pod_specs(value, owner)]


def referenced_secrets(spec: dict) -> set[str]:
    """The Secrets a Pod spec references (what the Node authorizer lets its node read), its image pull
    Secrets aside (they hold registry credentials, never the chart's keys)."""
    names = set()
    for volume in spec.get("volumes", []):
        names.add((volume.get("secret") or {}).get("secretName"))
        names.add(((volume.get("csi") or {}).get("nodePublishSecretRef") or {}).get("name"))
        for source in (volume.get("projected") or {}).get("sources", []):
            names.add((source.get("secret") or {}).get("name"))
    containers = [*spec["containers"], *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]
    for container in containers:
        for env in container.get("env", []):
            names.add(((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name"))
        for source in container.get("envFrom", []):
            names.add((source.get("secretRef") or {}).get("name"))
    return names - {None}


# tls.key, ca.key, private-key. Not Django's SECRET_KEY (it signs the console's sessions; every role of the
# service has it, as it has the database's URL: those roles are kept off the GPU nodes by their nodeSelectors).
PRIVATE_KEY_FIELD = re.compile(r"(^|[.-])key$", re.IGNORECASE)


def holds_a_private_key(secret: dict) -> bool:
    fields = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    for name, value in fields.items():
        text = value if name in (secret.get("stringData") or {}) else base64.b64decode(value).decode(errors="replace")
        if PRIVATE_KEY_FIELD.search(name) or "PRIVATE KEY-----" in text:
            return True
    return False


def key_bearing(objects) -> set[str]:
    """The chart's Secrets that hold a private key: rendered ones with a key field (or a PEM private key),
    and every cert-manager Certificate's Secret (cert-manager writes its key there)."""
    rendered = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret" and holds_a_private_key(o)}
    certificates = {o["spec"]["secretName"] for o in objects if o["kind"] == "Certificate"}
    return rendered | certificates


def referenced_configmaps(spec: dict) -> set[str]:
    """The ConfigMaps a Pod spec references (its node may read them too)."""
    names = set()
    for volume in spec.get("volumes", []):
        names.add((volume.get("configMap") or {}).get("name"))
        for source in (volume.get("projected") or {}).get("sources", []):
            names.add((source.get("configMap") or {}).get("name"))
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        for env in container.get("env", []):
            names.add(((env.get("valueFrom") or {}).get("configMapKeyRef") or {}).get("name"))
        for source in container.get("envFrom", []):
            names.add((source.get("configMapRef") or {}).get("name"))
    return names - {None}
