"""The peer endpoints' upload limits of a node, set by its Node's annotations and read from its plugin."""

from __future__ import annotations

import requests

from gpustack_models.kinds import GROUP
from tests.support.waiting import wait_for

CONNECTIONS = f"{GROUP}/upload-connections"
BYTES_PER_SECOND = f"{GROUP}/upload-bytes-per-second"
STORAGE = f"/apis/{GROUP}/v1alpha1"


def annotate(core, node: str, annotations: dict) -> None:
    """Set the Node's annotations (``None`` removes one), as an administrator would with kubectl."""
    core.patch_node(node, {"metadata": {"annotations": annotations}})


def plugin_metric(plugin, name: str) -> float | None:
    session = requests.Session()
    session.trust_env = False
    text = session.get(f"{plugin.url}/metrics", verify=False, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def plugin_upload_limits(plugin) -> tuple[float | None, float | None]:
    """(transfers at once, bytes per second) the plugin's peer server enforces now, from its ``/metrics``."""
    return (
        plugin_metric(plugin, "gpustack_models_plugin_peer_uploads_limit"),
        plugin_metric(plugin, "gpustack_models_plugin_peer_upload_rate_limit_bytes_per_second"),
    )


def limit_uploads(core, kube, plugin, connections: int | None, bytes_per_second: int | None) -> dict:
    """Annotate ``plugin``'s Node with these upload limits (``None``: remove the annotation, the worker's
    default applies), wait for its store's spec to carry them and its peer server to enforce them; the spec."""
    annotate(core, plugin.node, {CONNECTIONS: _text(connections), BYTES_PER_SECOND: _text(bytes_per_second)})
    wanted = {"connections": connections or 8, "bytesPerSecond": bytes_per_second or 0}

    def spec():
        upload = kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")["spec"].get("upload")
        return upload == wanted and upload

    wait_for(spec, timeout=30, message=f"the store of {plugin.node} to carry {wanted}")
    enforced = (float(wanted["connections"]), float(wanted["bytesPerSecond"]))
    wait_for(lambda: plugin_upload_limits(plugin) == enforced, timeout=30, message=f"the plugin to enforce {wanted}")
    return wanted


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)
