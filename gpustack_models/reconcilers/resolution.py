"""Resolution: an artifact's source, turned once into a commit and a manifest digest, written to its status.

``resolve_artifact`` reads the artifact, and unless it is already resolved for its generation:

1. a claim source is resolved when the claim exists;
2. a hub source reads its Secret's token (if it names one), asks the hub for the revision's commit and
   file list, selects the files with the patterns, computes the digest and checks ``expectedDigest``;
3. the manifest and where it came from are kept in the mirror (the plugins' fetch tickets need them);
4. the resolver's part of the status is applied (``Resolved`` condition, ``status.resolved``).

A failure that may pass (hub unavailable, Secret or claim missing) asks the caller to retry with backoff
and never revokes an earlier resolution; the others are written as the ``Resolved=False`` reason and tried
again later (``retries``). Each outcome is also a Kubernetes Event on the artifact: ``Resolved`` naming the
commit and digest, or ``ResolutionFailed`` with the reason (one series per reason).
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.informers import mirror
from gpustack_models.informers.reactions import enqueue, reacts_to
from gpustack_models.kinds import oci_reference
from gpustack_models.kinds.formatting import human_bytes
from gpustack_models.models import Artifact, ConditionStatus, Manifest, Prefetch, PrefetchTarget, Resolution, SourceKind
from gpustack_models.reconcilers import budgets, events, readiness, retries
from gpustack_models.reconcilers.task_names import (
    RECONCILE_NODE_STORE,
    RECONCILE_PREFETCH,
    RESOLVE_ARTIFACT,
    ROLLUP_DIGEST,
)
from gpustack_models.reconcilers.writes import RESOLVER, apply_status, artifact_path, condition, find_condition
from gpustack_models.sources import SourceError, build_manifest, huggingface, modelscope, oci, s3

log = logging.getLogger(__name__)

RETRYABLE = retries.RETRYABLE
HUBS = {
    SourceKind.HUGGING_FACE: (huggingface, "HF_ENDPOINT", "main"),
    SourceKind.MODEL_SCOPE: (modelscope, "MODELSCOPE_ENDPOINT", None),  # the repository's default branch
}


def needs_resolution(obj: dict, before: dict | None = None) -> bool:
    """Not yet resolved for its generation (a written failure for this generation counts as an answer). A
    temporary failure is tried again on its own schedule (the task's countdown, which the condition states):
    here only when the mirror first sees it (``before`` None: a new mirror), never because of the event of
    its own status write, which would retry it at once, hub's ``Retry-After`` or not."""
    generation = (obj.get("metadata") or {}).get("generation") or 0
    status = obj.get("status") or {}
    if status.get("observedGeneration") != generation:
        return True
    return before is None and find_condition(obj, "Resolved").get("reason") in RETRYABLE


def _resolved_digest(body: dict | None) -> str:
    return ((body or {}).get("status") or {}).get("resolved", {}).get("manifestDigest", "")


@reacts_to(mirror.ARTIFACTS)
def artifact_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """An artifact to resolve (its generation, or ``worker.gpustack.ai/requested-at``, asks for it); one whose
    resolved digest changed concerns its prefetches, the nodes they target and the digest's roll-up."""
    if after is not None and retries.take_request(after):  # worker.gpustack.ai/requested-at took a new value
        enqueue(RESOLVE_ARTIFACT, namespace, name, force=True)
    elif after is not None and needs_resolution(after, before):
        enqueue(RESOLVE_ARTIFACT, namespace, name)
    old_digest, new_digest = _resolved_digest(before), _resolved_digest(after)
    if old_digest == new_digest and after is not None:
        return
    for prefetch in Prefetch.objects.live().filter(namespace=namespace, artifact_name=name):
        enqueue(RECONCILE_PREFETCH, namespace, prefetch.name)
    # The digest its prefetches place changed (resolved, or gone): their nodes' spec.models with it.
    targets = PrefetchTarget.objects.filter(prefetch__namespace=namespace, prefetch__artifact_name=name)
    for node in sorted(set(targets.values_list("node", flat=True))):
        enqueue(RECONCILE_NODE_STORE, node)
    if new_digest:
        enqueue(ROLLUP_DIGEST, new_digest)


@dataclass
class Outcome:
    reason: str
    retry: bool = False
    retry_after: float | None = None
    postponed: bool = False  # nothing was asked of the hub: the namespace's share was spent


class Failed(Exception):
    """A resolution step failed for ``reason``; ``retry``: it may pass later."""

    def __init__(self, reason: str, message: str, retry: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.reason, self.message, self.retry, self.retry_after = reason, message, retry, retry_after


def resolve_artifact(namespace: str, name: str, force: bool = False, attempt: int = 0) -> Outcome:
    """Resolve ``namespace/name`` and write its status (see the module's docstring). ``force``: also when
    it is resolved for its generation already (a branch may have moved); ``attempt``: how many temporary
    failures in a row came before (the condition says when the next try is)."""
    try:
        obj = kube.default().get(artifact_path(namespace, name))
    except kube.NotFound:
        return Outcome("Gone")
    return ArtifactResolution(obj, force, attempt).run()


def short_digest(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}:{hexdigest[:12]}" if hexdigest else digest


class ArtifactResolution:
    """One resolution of one version of an artifact."""

    def __init__(self, obj: dict, force: bool = False, attempt: int = 0):
        self.obj, self.force, self.attempt = obj, force, attempt
        self.secret_name = self.secret_version = ""
        meta = obj["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.generation = meta.get("generation") or 0
        self.status = obj.get("status") or {}
        self.spec = obj.get("spec") or {}
        self.previous = find_condition(obj, "Resolved")

    def run(self) -> Outcome:
        current = self.status.get("observedGeneration") == self.generation
        if current and self.previous.get("status") == "True" and not self.force:
            return Outcome("Resolved")
        source = self.spec.get("source") or {}
        try:
            if SourceKind.CLAIM in source:
                return self.resolve_claim(source[SourceKind.CLAIM]["claimName"])
            if SourceKind.OCI in source:
                return self.resolve_oci(source[SourceKind.OCI])
            if SourceKind.S3 in source:
                return self.resolve_s3(source[SourceKind.S3])
            kind = SourceKind.HUGGING_FACE if SourceKind.HUGGING_FACE in source else SourceKind.MODEL_SCOPE
            return self.resolve_hub(kind, source.get(kind) or {})
        except Failed as failure:
            return self.fail(failure)

    # --- steps -----------------------------------------------------------------------------------------
    def resolve_claim(self, claim: str) -> Outcome:
        try:
            kube.default().get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        except kube.NotFound:
            raise Failed(
                "ClaimNotFound", f"PersistentVolumeClaim {claim!r} does not exist in {self.namespace}", True
            ) from None
        return self.succeed({}, f"claim {claim} exists")

    def resolve_hub(self, kind: str, member: dict) -> Outcome:
        wait = budgets.take(self.namespace)
        if wait > 0:
            return Outcome("Postponed", retry=True, retry_after=wait, postponed=True)
        self.secret_name = secret_name = (member.get("secretRef") or {}).get("name", "")
        token = self.read_token(secret_name) if secret_name else None
        hub, endpoint_setting, default_revision = HUBS[kind]
        endpoint = getattr(settings, endpoint_setting)
        revision = member.get("revision") or default_revision
        try:
            resolution = hub.resolve(
                member["repository"],
                revision,
                endpoint=endpoint,
                token=token,
                proxy=settings.HUB_PROXY or None,
                ca_bundle=settings.HUB_CA_BUNDLE or None,
                timeout=settings.HUB_TIMEOUT,
            )
        except SourceError as exc:
            raise Failed(exc.reason, exc.message, exc.retryable, exc.retry_after) from None
        files, digest = self.selected(resolution.files)
        origin = {"source": kind, "endpoint": endpoint, "repository": member["repository"]}
        resolved = self.recorded(files, digest, origin, resolution.commit, pinned=resolution.pinned)
        if resolution.pinned:
            message = f"{member['repository']}@{resolution.revision or revision} is {resolution.commit}"
        else:  # the hub named no commit: the files are listed at the revision, and the status says so
            message = resolution.note
        return self.succeed(resolved, message)

    def resolve_oci(self, member: dict) -> Outcome:
        """An OCI artifact: its reference pinned to a manifest digest, its layers as files (``sources.oci``)."""
        reference = member["reference"]
        try:
            ref = oci_reference.Reference.parse(reference)
        except oci_reference.InvalidReference as exc:
            raise Failed("InvalidReference", str(exc)) from None
        if settings.OCI_REQUIRE_DIGEST and not ref.pinned:
            message = f"{reference} names a tag: this cluster requires references pinned by digest (@sha256:<hex>)"
            raise Failed("ReferenceNotPinned", message)
        wait = budgets.take(self.namespace)
        if wait > 0:
            return Outcome("Postponed", retry=True, retry_after=wait, postponed=True)
        self.secret_name = secret_name = (member.get("secretRef") or {}).get("name", "")
        credentials = self.read_registry_credentials(secret_name, ref.registry) if secret_name else None
        try:
            resolution, endpoint, repository, extents = oci.resolve(
                reference,
                path=member.get("path"),
                credentials=credentials,
                insecure_registries=settings.OCI_INSECURE_REGISTRIES,
                platform=settings.OCI_PLATFORM,
                proxy=settings.HUB_PROXY or None,
                ca_bundle=settings.HUB_CA_BUNDLE or None,
                timeout=settings.HUB_TIMEOUT,
            )
        except SourceError as exc:
            raise Failed(exc.reason, exc.message, exc.retryable, exc.retry_after) from None
        files, digest = self.selected(resolution.files)
        pinned = {"files": {f.path: extents[f.path] for f in files if f.path in extents}}
        origin = {"source": SourceKind.OCI, "endpoint": endpoint, "repository": repository, "objects_pinned": pinned}
        resolved = self.recorded(files, digest, origin, resolution.commit)
        return self.succeed(resolved, f"{reference} is {resolution.commit}")

    def resolve_s3(self, member: dict) -> Outcome:
        """Objects under a prefix: each pinned by version and ETag, its sha256 from the store or computed once."""
        wait = budgets.take(self.namespace)
        if wait > 0:
            return Outcome("Postponed", retry=True, retry_after=wait, postponed=True)
        self.secret_name = secret_name = (member.get("secretRef") or {}).get("name", "")
        keys = self.read_s3_keys(secret_name) if secret_name else None
        endpoint, bucket, region = member["endpoint"].rstrip("/"), member["bucket"], member.get("region") or "us-east-1"
        try:
            resolution, locations = s3.resolve(
                endpoint,
                bucket,
                member.get("prefix"),
                region,
                keys,
                proxy=settings.HUB_PROXY or None,
                ca_bundle=settings.HUB_CA_BUNDLE or None,
                timeout=settings.HUB_TIMEOUT,
            )
        except SourceError as exc:
            raise Failed(exc.reason, exc.message, exc.retryable, exc.retry_after) from None
        files, digest = self.selected(resolution.files)
        pinned = {"region": region, "files": {f.path: locations[f.path].to_dict() for f in files}}
        origin = {"source": SourceKind.S3, "endpoint": endpoint, "repository": bucket, "objects_pinned": pinned}
        resolved = self.recorded(files, digest, origin, resolution.commit)
        versions = sum(1 for f in files if locations[f.path].version_id)
        pinned_by = f"{versions} by version, the others by ETag" if versions else "each by ETag"
        return self.succeed(
            resolved, f"s3://{bucket}/{s3.directory(member.get('prefix'))}: {len(files)} objects pinned, {pinned_by}"
        )

    def read_s3_keys(self, secret_name: str):
        """The access key and secret of the Secret (``accessKeyId``/``secretAccessKey``, or the AWS names)."""
        data = self.read_secret(secret_name).get("data") or {}
        for key_id, secret in (("accessKeyId", "secretAccessKey"), ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
            if data.get(key_id) and data.get(secret):
                return s3.Keys(
                    base64.b64decode(data[key_id]).decode().strip(), base64.b64decode(data[secret]).decode().strip()
                )
        keys = ", ".join(sorted(k for k in data if data[k])) or "none"
        message = f"Secret {secret_name!r} has no keys 'accessKeyId' and 'secretAccessKey' (its keys: {keys})"
        raise Failed("SecretKeyNotFound", message, True)

    def read_secret(self, secret_name: str) -> dict:
        try:
            secret = kube.default().get(f"/api/v1/namespaces/{self.namespace}/secrets/{secret_name}")
        except kube.NotFound:
            raise Failed("SecretNotFound", f"Secret {secret_name!r} does not exist in {self.namespace}", True) from None
        meta = secret.get("metadata") or {}
        self.secret_version = f"{meta.get('uid', '')}/{meta.get('resourceVersion', '')}"
        return secret

    def read_registry_credentials(self, secret_name: str, registry: str):
        """The credentials for ``registry`` in the Secret's ``.dockerconfigjson``."""
        raw = (self.read_secret(secret_name).get("data") or {}).get(".dockerconfigjson")
        if not raw:
            message = (
                f"Secret {secret_name!r} has no key '.dockerconfigjson': make it of type kubernetes.io/dockerconfigjson"
            )
            raise Failed("SecretKeyNotFound", message, True)
        try:
            found = oci.credentials_for(json.loads(base64.b64decode(raw)), registry)
        except ValueError as exc:
            raise Failed(
                "SecretKeyNotFound", f"Secret {secret_name!r}: .dockerconfigjson is malformed: {exc}", True
            ) from None
        if found is None:
            message = f"Secret {secret_name!r}: .dockerconfigjson has no auths entry for the registry {registry}"
            raise Failed("SecretKeyNotFound", message, True)
        return found

    def read_token(self, secret_name: str) -> str:
        secret = self.read_secret(secret_name)
        data = secret.get("data") or {}
        raw = data.get("token")
        if not raw:
            keys = ", ".join(sorted(k for k in data if data[k])) or "none"
            message = f"Secret {secret_name!r} has no key 'token' (its keys: {keys}); put the hub token under 'token'"
            raise Failed("SecretKeyNotFound", message, True)
        return base64.b64decode(raw).decode().strip()

    def selected(self, listed: list) -> tuple[list, str]:
        """The source's files the spec's patterns keep, and their digest, checked against ``expectedDigest``."""
        try:
            files, digest = build_manifest(listed, self.spec.get("allowPatterns"), self.spec.get("ignorePatterns"))
        except SourceError as exc:
            raise Failed(exc.reason, exc.message, exc.retryable, exc.retry_after) from None
        self.check_expected(digest)
        return files, digest

    def recorded(self, files: list, digest: str, origin: dict, commit: str, pinned: bool = True) -> dict:
        """The manifest and its origin remembered; the status's ``resolved`` (``revision`` when ``pinned``)."""
        self.remember(files, digest, dict(origin, commit=commit, secret_name=self.secret_name))
        resolved = {"manifestDigest": digest, "fileCount": len(files), "sizeBytes": sum(f.size for f in files)}
        return dict(resolved, revision=commit) if pinned else resolved

    def check_expected(self, digest: str) -> None:
        expected = self.spec.get("expectedDigest")
        if expected and expected != digest:
            raise Failed("DigestMismatch", f"resolution produced {digest}, spec.expectedDigest is {expected}")

    def remember(self, files: list, digest: str, origin: dict) -> None:
        """The manifest, and where this artifact's copy of it comes from (for the plugins' tickets)."""
        size = sum(f.size for f in files)
        with transaction.atomic():
            manifest, _ = Manifest.objects.get_or_create(
                digest=digest,
                defaults={"files": [f.__dict__ for f in files], "file_count": len(files), "size_bytes": size},
            )
            # The row of this very object: one recreated under the name meanwhile is another (its own uid).
            row = Artifact.objects.filter(namespace=self.namespace, name=self.name, uid=self.uid).first()
            if row is not None:
                defaults = {"artifact_uid": self.uid, "generation": self.generation, "manifest": manifest, **origin}
                Resolution.objects.update_or_create(artifact=row, defaults=defaults)

    # --- writing the outcome ---------------------------------------------------------------------------
    def regarding(self) -> dict:
        return events.regarding("ModelArtifact", self.name, self.uid, self.namespace)

    def succeed(self, resolved: dict, message: str) -> Outcome:
        self.write(resolved, self.resolved_condition(message))
        retries.succeeded(self.namespace, self.name, self.uid)
        if resolved.get("manifestDigest"):
            digest, size = short_digest(resolved["manifestDigest"]), human_bytes(resolved["sizeBytes"]) or "0B"
            message = f"{message}: digest {digest}, {resolved['fileCount']} files, {size}"
        events.record(self.regarding(), events.NORMAL, "Resolved", message)
        return Outcome("Resolved")

    def resolved_condition(self, message: str) -> dict:
        return condition("Resolved", ConditionStatus.TRUE, "Resolved", message, self.previous, self.generation)

    def fail(self, failure: Failed) -> Outcome:
        already = bool((self.status.get("resolved") or {}).get("manifestDigest"))
        log.info("resolving %s/%s: %s: %s", self.namespace, self.name, failure.reason, failure.message)
        if failure.retry:
            countdown = retries.temporary_countdown(self.attempt, failure.retry_after)
            next_try = (
                f"tried again automatically at {retries.when_said(timezone.now() + timedelta(seconds=countdown))}"
            )
        else:
            state = retries.failed(
                self.namespace, self.name, self.uid, failure.reason, self.secret_name, self.secret_version
            )
            log.info("resolving %s/%s again at %s", self.namespace, self.name, state.retry_at)
            secret = f", when Secret {self.secret_name!r} changes" if self.secret_name else ""
            next_try = (
                f"tried again automatically at {retries.when_said(state.retry_at)}{secret}, or at once when the "
                f"annotation {retries.REQUESTED_AT} takes a new value"
            )
        # A temporary failure never revokes an earlier resolution: keep Resolved=True then.
        if not (failure.retry and already):
            said = f"{failure.message}; {next_try}"
            cond = condition("Resolved", ConditionStatus.FALSE, failure.reason, said, self.previous, self.generation)
            self.write(None, cond)
        message = f"{failure.reason}: {failure.message}"
        events.record(self.regarding(), events.WARNING, "ResolutionFailed", message, series_key=failure.reason)
        return Outcome(failure.reason, retry=failure.retry, retry_after=failure.retry_after)

    def write(self, resolved: dict | None, cond: dict) -> None:
        """Apply the resolver's part of the status. ``resolved=None`` keeps what it was (a failure). A claim
        source's ``Ready`` follows its ``Resolved`` (``readiness``); a hub source's is the roll-up's."""
        status = {"observedGeneration": self.generation, "conditions": [cond]}
        if SourceKind.CLAIM in (self.spec.get("source") or {}):
            ready = readiness.claim_ready() if cond["status"] == ConditionStatus.TRUE else None
            ready = ready or (ConditionStatus.FALSE, cond["reason"], "the claim is not resolved: see Resolved")
            previous = find_condition({"status": self.status}, "Ready")
            status["conditions"].append(condition("Ready", *ready, previous or None, self.generation))
        if resolved:
            status["resolved"] = resolved
        elif resolved is None and self.status.get("resolved"):
            status["resolved"] = self.status["resolved"]
        metadata = {"name": self.name, "namespace": self.namespace, "uid": self.uid}
        apply_status(artifact_path(self.namespace, self.name), "ModelArtifact", metadata, status, RESOLVER)
