"""What the chaos run keeps the product busy with: artifacts across tenants on the fake hub, prefetched to
nodes, and mounted into Pods through each plugin's CSI socket as a kubelet calls it (retried while the
model downloads, as the kubelet retries). It knows what should hold: which (node, digest) pairs are wanted,
which trees should be byte for byte what the hub serves, which mounts are in place."""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import requests
import urllib3
from kubernetes.client.exceptions import ApiException

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.plugin.csi.generated import csi_pb2_grpc
from tests.chaos.chaos_stack import DISK_BYTES, DISK_NODE
from tests.chaos.invariants import store_models
from tests.support.csi_calls import pod_context, publish_request
from tests.support.pods import model_pod, model_volume, volume_handle
from tests.support.waiting import wait_for

STORAGE = f"/apis/{GROUP}/v1alpha1"
MiB = 1024 * 1024


@dataclass
class Model:
    ns: str
    name: str
    files: dict[str, bytes]
    digest: str = ""
    repo: str = ""

    @property
    def sums(self) -> dict[str, str]:
        return {path: hashlib.sha256(data).hexdigest() for path, data in self.files.items()}

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())

    @property
    def weights(self) -> str:
        """How the hub's CDN names the big file (its sha256): what a hub fault matches."""
        return hashlib.sha256(self.files["model.safetensors"]).hexdigest()


@dataclass
class Mount:
    model: Model
    plugin: object
    pod: str
    uid: str
    target: Path
    done: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def volume_id(self) -> str:
        return volume_handle(self.uid, "model")


def model_files(seed: str, mb: int) -> dict[str, bytes]:
    block = hashlib.sha256(seed.encode()).digest() * (MiB // 32)
    return {
        "config.json": json.dumps({"model": seed}).encode(),
        "model.safetensors": block * mb,
        "tokenizer.json": (seed * 64).encode(),
    }


class Workload:
    def __init__(self, stack, core, rng: random.Random, run: str, sizes: tuple[int, int]):
        self.stack, self.core, self.rng, self.run, self.sizes = stack, core, rng, run, sizes
        self.kube = stack.kube()
        self.tenants: list[str] = []
        self.models: list[Model] = []
        self.prefetches: dict[str, tuple[Model, list[str]]] = {}  # name -> (model, nodes)
        self.mounts: list[Mount] = []
        self.counter = 0

    # --- setting it up --------------------------------------------------------------------------------------
    def create_tenants(self, count: int) -> None:
        for index in range(count):
            name = f"chaos-{self.run}-t{index}"
            self.core.create_namespace({"metadata": {"name": name}})
            self.tenants.append(name)

    def delete_tenants(self) -> None:
        for name in self.tenants:
            try:
                self.core.delete_namespace(name)
            except Exception:  # cleanup of a run that may have failed anywhere
                pass

    def add_model(self, ns: str | None = None) -> Model:
        self.counter += 1
        ns = ns or self.tenants[self.counter % len(self.tenants)]
        name = f"m{self.counter:03d}"
        repo = f"org/chaos-{self.run}-{name}"
        model = Model(ns, name, model_files(repo, self.rng.randint(*self.sizes)), repo=repo)
        self.stack.hub.add_hf_repo(repo, model.files)
        body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": name},
                "spec": {"source": {"huggingFace": {"repository": repo}}}}  # fmt: skip
        self._retry(lambda: self.kube.create(f"{STORAGE}/namespaces/{ns}/modelartifacts", body))
        self.models.append(model)
        return model

    def resolve(self, models: list[Model], timeout: float = 240) -> None:
        for model in models:
            path = f"{STORAGE}/namespaces/{model.ns}/modelartifacts/{model.name}"

            def digest(path=path):
                obj = self._retry(lambda: self.kube.get(path))
                return ((obj.get("status") or {}).get("resolved") or {}).get("manifestDigest")

            model.digest = wait_for(digest, timeout=timeout, interval=0.5, message=f"{model.name} to resolve")

    def prefetch(self, model: Model, nodes: list[str]) -> str:
        self.counter += 1
        name = f"{model.name}-p{self.counter:03d}"
        body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelPrefetch", "metadata": {"name": name},
                "spec": {"artifactRef": {"name": model.name}, "nodeNames": nodes}}  # fmt: skip
        self._retry(lambda: self.kube.create(f"{STORAGE}/namespaces/{model.ns}/modelprefetches", body))
        self.prefetches[name] = (model, nodes)
        return name

    def unprefetch(self, name: str) -> None:
        model, _ = self.prefetches.pop(name)
        try:
            self._retry(lambda: self.kube.delete(f"{STORAGE}/namespaces/{model.ns}/modelprefetches/{name}"))
        except kube.NotFound:
            pass

    def mount(self, model: Model, plugin) -> Mount:
        self.counter += 1
        pod = f"{model.name}-pod{self.counter:03d}"
        body = model_pod(pod, plugin.node, [model_volume("model", model.name)])
        created = self._retry(lambda: self.core.create_namespaced_pod(model.ns, body))
        uid = created.metadata.uid
        target = self.stack.kubelet_dir / "pods" / uid / "volumes" / "kubernetes.io~csi" / "model" / "mount"
        target.parent.mkdir(parents=True, exist_ok=True)
        mount = Mount(model, plugin, pod, uid, target)
        self.mounts.append(mount)
        return mount

    def places(self, model: Model, count: int) -> list:
        """``count`` plugins for ``model``, at random; the one on the small volume only while what it is asked to
        hold stays under 40 % of its size (its high watermark is for the disk-full fault to reach, not the
        workload: a node asked for more than it holds leaves copies wanted and never Ready, rightly)."""
        small = self.stack.plugins[DISK_NODE]
        asked = sum(m.size for m in self.models if (small.node, m.digest) in self.wanted())
        room = asked + model.size < 0.4 * DISK_BYTES
        return self.rng.sample([p for p in self.stack.plugins if room or p is not small], count)

    # --- what should hold ------------------------------------------------------------------------------------
    def wanted(self) -> set[tuple[str, str]]:
        """(node, digest) of every prefetch target and every mount."""
        pairs = {(node, model.digest) for model, nodes in self.prefetches.values() for node in nodes}
        return pairs | {(m.plugin.node, m.model.digest) for m in self.mounts}

    def store_models(self, node: str) -> list[dict]:
        return self._retry(lambda: store_models(self.kube, node))

    def by_digest(self) -> dict[str, Model]:
        return {model.digest: model for model in self.models if model.digest}

    # --- the kubelet's side of a mount -------------------------------------------------------------------------
    def try_mounts(self) -> int:
        """One NodePublishVolume of every mount not yet in place (UNAVAILABLE while it downloads, or while the
        plugin is down: tried again later); how many are in place."""
        for mount in self.mounts:
            if not mount.done and mount.plugin.alive():
                mount.done = self._publish(mount)
        return sum(m.done for m in self.mounts)

    def _publish(self, mount: Mount) -> bool:
        context = pod_context(mount.model.ns, mount.pod, mount.uid, mount.model.name)
        request = publish_request(mount.volume_id, mount.target, context)
        with grpc.insecure_channel(f"unix:{mount.plugin.csi_socket}") as channel:
            try:
                csi_pb2_grpc.NodeStub(channel).NodePublishVolume(request, timeout=15)
                return True
            except grpc.RpcError as error:
                mount.errors.append(f"{error.code().name}: {error.details()}"[:200])
                return False

    def _retry(self, call, attempts: int = 30):
        """A call made while faults come and go (kube-apiserver restarting refuses connections or answers
        5xx/429 for a moment): tried again, for up to about a minute. Any other answer is the caller's."""
        for attempt in range(attempts):
            try:
                return call()
            except kube.StatusError as exc:
                if (exc.code < 500 and exc.code != 429) or attempt == attempts - 1:
                    raise
            except ApiException as exc:
                if (exc.status < 500 and exc.status != 429) or attempt == attempts - 1:
                    raise
            except (OSError, urllib3.exceptions.HTTPError, requests.RequestException):
                if attempt == attempts - 1:
                    raise
            time.sleep(min(2.0, 0.1 * 2**attempt))  # backing off a server that is restarting
        return None
