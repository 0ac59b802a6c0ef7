"""The worker resolves artifacts against the (fake) hubs with the real clients, through a real Celery worker."""

import base64
import hashlib
import re
import time
import uuid
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from gpustack_models.sources import ManifestFile, manifest_digest
from tests.support import wait_for

LFS_THRESHOLD = 1024


def repo_files(seed: str) -> dict[str, bytes]:
    return {
        "config.json": f'{{"model": "{seed}"}}'.encode(),
        "tokenizer.json": (seed * 40).encode(),
        "model-00001.safetensors": hashlib.sha256(seed.encode()).digest() * 200,
        "model-00002.safetensors": hashlib.sha256((seed + "2").encode()).digest() * 150,
        "original/consolidated.pth": b"x" * 3000,
        "README.md": b"# readme\n",
    }


def expected_digest(files: dict[str, bytes], *, all_sha256=False) -> str:
    entries = []
    for path, data in files.items():
        if all_sha256 or len(data) >= LFS_THRESHOLD:
            entries.append(ManifestFile(path, len(data), "sha256", hashlib.sha256(data).hexdigest(), lfs=True))
        else:
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            entries.append(ManifestFile(path, len(data), "gitsha1", blob))
    return manifest_digest(entries)


@pytest.fixture
def artifacts(worker_stack, worker_api, cluster, admin_http, namespace):
    """Create v1 ModelArtifacts and wait for the worker's answer."""

    base = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"

    class Artifacts:
        ns = namespace

        def create(self, name, source, ns=None, **spec):
            url = base.replace(namespace, ns) if ns else base
            body = {
                "apiVersion": f"{GROUP}/v1",
                "kind": "ModelArtifact",
                "metadata": {"name": name},
                "spec": {"source": source, **spec},
            }
            resp = admin_http.post(url, json=body)
            assert resp.status_code == 201, resp.text
            return resp.json()

        def get(self, name, ns=None):
            url = base.replace(namespace, ns) if ns else base
            return admin_http.get(f"{url}/{name}").json()

        def answered(self, name, ns=None, timeout=60, reason=None):
            def done():
                obj = self.get(name, ns)
                cond = next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Resolved"), None)
                if cond and (cond["reason"] == reason if reason else cond["status"] == "True"):
                    return obj
                return None

            return wait_for(done, timeout=timeout, message=f"{name} to be {reason or 'Resolved'}")

    return Artifacts()


def hf(repository, revision=None, secret=None):
    source = {"repository": repository}
    if revision:
        source["revision"] = revision
    if secret:
        source["secretRef"] = {"name": secret}
    return {"huggingFace": source}


def test_it_resolves_a_hugging_face_branch_to_its_commit_and_digest(artifacts, hub):
    files = repo_files("main-" + uuid.uuid4().hex)
    repo = f"org/m-{uuid.uuid4().hex[:6]}"
    commit = hub.add_hf_repo(repo, files, tags=("v1.0",))
    artifacts.create("a", hf(repo))
    obj = artifacts.answered("a")
    resolved = obj["status"]["resolved"]
    assert resolved["revision"] == commit and len(commit) == 40
    assert resolved["fileCount"] == len(files)
    assert resolved["sizeBytes"] == sum(len(d) for d in files.values())
    assert resolved["manifestDigest"] == expected_digest(files)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    # A tag and the full commit name the same content.
    artifacts.create("by-tag", hf(repo, "v1.0"))
    artifacts.create("by-commit", hf(repo, commit))
    for name in ("by-tag", "by-commit"):
        assert artifacts.answered(name)["status"]["resolved"] == resolved


def test_it_resolves_a_modelscope_master(artifacts, hub):
    files = repo_files("ms-" + uuid.uuid4().hex)
    repo = f"org/ms-{uuid.uuid4().hex[:6]}"
    commit = hub.add_ms_repo(repo, files)
    artifacts.create("ms", {"modelScope": {"repository": repo}})
    resolved = artifacts.answered("ms")["status"]["resolved"]
    assert resolved["revision"] == commit
    assert resolved["manifestDigest"] == expected_digest(files, all_sha256=True)
    assert resolved["fileCount"] == len(files)


def test_a_modelscope_artifact_without_a_revision_resolves_a_repository_whose_branch_is_main(artifacts, hub):
    repo = f"org/ms-main-{uuid.uuid4().hex[:6]}"
    commit = hub.add_ms_repo(repo, {"config.json": b"{}"}, revision="main")
    artifacts.create("ms-main", {"modelScope": {"repository": repo}})
    obj = artifacts.answered("ms-main")
    assert obj["status"]["resolved"]["revision"] == commit
    assert resolved_condition(obj)["message"] == f"{repo}@main is {commit}"


def test_it_pins_a_modelscope_revision_without_latest_committer_or_says_it_cannot(artifacts, hub):
    files = repo_files("ms-pin-" + uuid.uuid4().hex)
    repo = f"org/ms-{uuid.uuid4().hex[:6]}"
    commit = hub.add_ms_repo(repo, files)
    try:
        hub.ms_latest_committer = "absent"  # real answers sometimes leave it out: the files' commits pin it
        artifacts.create("from-files", {"modelScope": {"repository": repo}})
        assert artifacts.answered("from-files")["status"]["resolved"]["revision"] == commit
        hub.ms_file_commits = False  # nothing names a commit any more
        artifacts.create("unpinned", {"modelScope": {"repository": repo}})
        status = artifacts.answered("unpinned")["status"]
    finally:
        hub.ms_latest_committer, hub.ms_file_commits = "present", True
    assert "revision" not in status["resolved"]  # never the branch name as if it were a commit
    assert status["resolved"]["manifestDigest"] == expected_digest(files, all_sha256=True)
    (resolved,) = [c for c in status["conditions"] if c["type"] == "Resolved"]
    assert resolved["status"] == "True" and "did not name the commit" in resolved["message"]


def test_it_selects_files_with_patterns_exactly(artifacts, hub):
    files = repo_files("pat-" + uuid.uuid4().hex)
    repo = f"org/p-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, files)
    artifacts.create("weights", hf(repo), allowPatterns=["*.safetensors", "*.json"], ignorePatterns=["tokenizer*"])
    artifacts.create("no-original", hf(repo), ignorePatterns=["original/"])
    weights = {
        p: d for p, d in files.items() if p.endswith((".safetensors", ".json")) and not p.startswith("tokenizer")
    }
    no_original = {p: d for p, d in files.items() if not p.startswith("original/")}
    assert artifacts.answered("weights")["status"]["resolved"]["manifestDigest"] == expected_digest(weights)
    assert artifacts.answered("no-original")["status"]["resolved"]["manifestDigest"] == expected_digest(no_original)
    assert expected_digest(weights) != expected_digest(no_original)


def test_it_gives_the_same_files_the_same_digest_across_namespaces(artifacts, hub, core):
    files = repo_files("shared-" + uuid.uuid4().hex)
    first, second = f"org/s1-{uuid.uuid4().hex[:6]}", f"other/s2-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(first, files)
    hub.add_hf_repo(second, files)
    other_ns = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=other_ns)))
    try:
        artifacts.create("one", hf(first))
        artifacts.create("two", hf(second), ns=other_ns)
        one = artifacts.answered("one")["status"]["resolved"]["manifestDigest"]
        two = artifacts.answered("two", ns=other_ns)["status"]["resolved"]["manifestDigest"]
        assert one == two == expected_digest(files)
    finally:
        core.delete_namespace(other_ns)


def test_it_reports_access_denied_for_an_unknown_or_private_repo(artifacts, hub):
    private = f"org/private-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(private, {"config.json": b"{}"}, private=True, token="hf_secret_token")
    artifacts.create("unknown", hf(f"org/none-{uuid.uuid4().hex[:6]}"))
    artifacts.create("private", hf(private))
    for name in ("unknown", "private"):
        obj = artifacts.answered(name, reason="AccessDenied")
        assert "resolved" not in obj["status"]


def test_it_sends_the_secret_token_and_waits_for_a_missing_secret(artifacts, hub, core):
    private = f"org/private-{uuid.uuid4().hex[:6]}"
    files = {"config.json": b'{"private": true}'}
    hub.add_hf_repo(private, files, private=True, token="hf_good_token")
    artifacts.create("tokened", hf(private, secret="hf-token"))
    artifacts.answered("tokened", reason="SecretNotFound")
    core.create_namespaced_secret(
        artifacts.ns,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="hf-token"), data={"token": base64.b64encode(b"hf_good_token").decode()}
        ),
    )
    resolved = artifacts.answered("tokened", timeout=60)["status"]["resolved"]
    assert resolved["manifestDigest"] == expected_digest(files)
    authorized = [r for r in hub.requests if private in r.path and r.token == "hf_good_token" and r.status == 200]
    assert authorized, "the hub saw no successful request for the private repository"


def test_it_tells_a_secret_without_the_token_key_from_a_missing_secret_and_lists_its_keys(artifacts, hub, core):
    private = f"org/private-{uuid.uuid4().hex[:6]}"
    files = {"config.json": b'{"keyed": true}'}
    hub.add_hf_repo(private, files, private=True, token="hf_keyed_token")
    encoded = base64.b64encode(b"hf_keyed_token").decode()
    secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="hf-keyless"), data={"HF_TOKEN": encoded})
    core.create_namespaced_secret(artifacts.ns, secret)
    artifacts.create("keyless", hf(private, secret="hf-keyless"))
    message = resolved_condition(artifacts.answered("keyless", reason="SecretKeyNotFound"))["message"]
    said = "Secret 'hf-keyless' has no key 'token' (its keys: HF_TOKEN); put the hub token under 'token'; tried again"
    assert message.startswith(f"{said} automatically at 20"), message
    core.patch_namespaced_secret("hf-keyless", artifacts.ns, {"data": {"token": encoded}})
    resolved = artifacts.answered("keyless", timeout=60)["status"]["resolved"]
    assert resolved["manifestDigest"] == expected_digest(files)


def test_it_reports_an_unknown_revision(artifacts, hub):
    repo = f"org/r-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}"})
    artifacts.create("norev", hf(repo, "no-such-branch"))
    artifacts.answered("norev", reason="RevisionNotFound")


def test_it_retries_through_hub_errors(artifacts, hub):
    repo = f"org/flaky-{uuid.uuid4().hex[:6]}"
    files = {"config.json": b'{"flaky": 1}'}
    hub.add_hf_repo(repo, files)
    hub.faults.fail(repo, 503, times=2)
    artifacts.create("flaky", hf(repo))
    obj = artifacts.answered("flaky", timeout=60)
    assert obj["status"]["resolved"]["manifestDigest"] == expected_digest(files)
    failed = [r for r in hub.requests if repo in r.path and r.status == 503]
    assert len(failed) == 2


def test_a_failed_resolution_says_when_it_is_tried_again(artifacts, hub):
    repo = f"org/limited-{uuid.uuid4().hex[:6]}"
    files = {"config.json": b'{"limited": 1}'}
    hub.add_hf_repo(repo, files)
    # On the file tree (the client itself waits out a 429 on the model info); the suite caps retries at 3 s.
    hub.faults.fail(f"/api/models/{repo}/tree/", 429, times=1, retry_after=3)
    before = time.time()
    artifacts.create("limited", hf(repo))
    failing = artifacts.answered("limited", reason="SourceUnavailable")
    after = time.time()
    message = resolved_condition(failing)["message"]
    said = re.search(r"; tried again automatically at (\S+)$", message)
    assert said, message
    at = datetime.strptime(said[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    assert int(before + 3) <= at <= after + 3, (before, at, after)  # written to the second
    assert artifacts.answered("limited", timeout=30)["status"]["resolved"]["manifestDigest"] == expected_digest(files)
    (refused,) = [r for r in hub.requests if repo in r.path and r.status == 429]
    retried = min(r.started for r in hub.requests if repo in r.path and r.started > refused.started)
    assert at - 1 <= retried <= at + 2, (at, retried)  # tried again when it said (the stamp drops the fraction)


def resolved_condition(obj: dict) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Resolved")


def test_it_reports_an_empty_manifest_with_the_files_that_exist(artifacts, hub):
    repo = f"org/e-{uuid.uuid4().hex[:6]}"
    files = {f"shard-{i:02d}.SAFETENSORS": b"x" for i in range(12)} | {"config.json": b"{}"}
    hub.add_hf_repo(repo, files)
    artifacts.create("empty", hf(repo), allowPatterns=["*.safetensors"])
    message = resolved_condition(artifacts.answered("empty", reason="EmptyManifest"))["message"]
    assert message.startswith("no file matches spec.allowPatterns *.safetensors (patterns are case-sensitive: ignoring"
                              " case they would select 12 files)"), message  # fmt: skip
    assert "13 files" in message and "config.json" in message and "shard-00.SAFETENSORS" in message, message
    assert "and 3 more" in message, message


def test_it_says_no_token_was_given_for_a_missing_repository(artifacts, hub, core):
    artifacts.create("unknown", hf(f"org/none-{uuid.uuid4().hex[:6]}"))
    message = resolved_condition(artifacts.answered("unknown", reason="AccessDenied"))["message"]
    assert "does not exist, or it is private and no token was given" in message and "secretRef" in message, message
    private = f"org/private-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(private, {"config.json": b"{}"}, private=True, token="hf_owner_token")
    hub.add_token("hf_stranger_token")
    put_secret(core, artifacts.ns, "stranger", "hf_stranger_token")
    artifacts.create("stranger", hf(private, secret="stranger"))
    message = resolved_condition(artifacts.answered("stranger", reason="AccessDenied"))["message"]
    assert "the token given has no access" in message and "no token was given" not in message, message


def put_secret(core, namespace: str, name: str, token: str) -> None:
    body = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), data={"token": base64.b64encode(token.encode()).decode()})
    try:
        core.create_namespaced_secret(namespace, body)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_secret(name, namespace, body)


def test_it_resolves_a_denied_artifact_within_a_minute_of_its_secret_being_fixed(artifacts, hub, core, mirror_db):
    from gpustack_models.models import ResolveState

    private = f"org/private-{uuid.uuid4().hex[:6]}"
    files = {"config.json": b'{"fixed": true}'}
    hub.add_hf_repo(private, files, private=True, token="hf_right_token")
    hub.add_token("hf_wrong_token")
    put_secret(core, artifacts.ns, "hub", "hf_wrong_token")
    before = time.time()
    artifacts.create("fixme", hf(private, secret="hub"))
    artifacts.answered("fixme", reason="AccessDenied")
    state = wait_for(lambda: ResolveState.objects.filter(namespace=artifacts.ns, name="fixme", failures__gte=1).first(),
                     message="the failure to be remembered")  # fmt: skip
    # The slow retry is at least the default base (5 minutes) after the failure: within the minute waited
    # below, only the Secret's change can resolve it.
    assert state.retry_at.timestamp() >= before + 300, (before, state.retry_at)
    put_secret(core, artifacts.ns, "hub", "hf_right_token")
    resolved = artifacts.answered("fixme", timeout=60)["status"]["resolved"]
    assert resolved["manifestDigest"] == expected_digest(files)


def test_it_backs_off_terminal_failures_per_artifact(artifacts, mirror_db):
    from gpustack_models.models import ResolveState

    before = time.time()
    artifacts.create("gone", hf(f"org/none-{uuid.uuid4().hex[:6]}"))
    artifacts.answered("gone", reason="AccessDenied")
    state = wait_for(lambda: ResolveState.objects.filter(namespace=artifacts.ns, name="gone", failures=1).first(),
                     message="the failure to be remembered")  # fmt: skip
    after = time.time()
    assert state.failed_reason == "AccessDenied"
    # The default base, 5 minutes, after the failure (which came between the two readings of the clock).
    assert before + 300 <= state.retry_at.timestamp() <= after + 300, (before, state.retry_at, after)
    # The condition tells the user the same moment, and the way to try at once.
    message = resolved_condition(artifacts.get("gone"))["message"]
    stamp = state.retry_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert message.endswith(
        f"; tried again automatically at {stamp}, or at once when the annotation worker.gpustack.ai/requested-at"
        " takes a new value"
    ), message


@pytest.mark.django_db
def test_it_doubles_the_terminal_backoff_up_to_its_max(settings):
    from django.utils import timezone

    from gpustack_models.reconcilers import retries

    settings.RESOLVE_TERMINAL_RETRY_BASE, settings.RESOLVE_TERMINAL_RETRY_MAX = 300.0, 1000.0
    ns, name, uid = f"b-{uuid.uuid4().hex[:6]}", "a", str(uuid.uuid4())
    waits = []
    for _ in range(4):
        state = retries.failed(ns, name, uid, "RevisionNotFound", "", "")
        waits.append(round((state.retry_at - timezone.now()).total_seconds() / 10) * 10)
    assert waits == [300, 600, 1000, 1000]
    retries.succeeded(ns, name, uid)
    assert (
        round((retries.failed(ns, name, uid, "RevisionNotFound", "", "").retry_at - timezone.now()).total_seconds())
        == 300
    )
    # A new object under the same name starts afresh.
    assert retries.failed(ns, name, str(uuid.uuid4()), "RevisionNotFound", "", "").failures == 1


@pytest.mark.django_db
def test_it_schedules_failed_artifacts_no_row_schedules_yet():
    from gpustack_models.models import Artifact
    from gpustack_models.reconcilers import retries

    ns = f"u-{uuid.uuid4().hex[:6]}"
    for name, reason in (("denied", "AccessDenied"), ("waiting", "SourceUnavailable"), ("norev", "RevisionNotFound")):
        Artifact.objects.create(namespace=ns, name=name, resource_version=1, source="huggingFace",
                                resolved_status="False", resolved_reason=reason)  # fmt: skip
    assert sorted(n for s, n in retries.unscheduled(10_000) if s == ns) == ["denied", "norev"]
    retries.failed(ns, "denied", "", "AccessDenied", "", "")
    assert [n for s, n in retries.unscheduled(10_000) if s == ns] == ["norev"]


@pytest.mark.django_db
def test_it_resolves_again_an_artifact_whose_resolution_was_never_done():
    """Found by the chaos run: Redis restarted empty while the mirror enqueued an artifact's resolution; the
    artifact stayed without a Resolved condition, and nothing but the periodic pass looks for such."""
    from datetime import timedelta

    from django.utils import timezone

    from gpustack_models.models import Artifact
    from gpustack_models.reconcilers import retries

    ns = f"n-{uuid.uuid4().hex[:6]}"
    for name, status, reason in (("lost", "", ""), ("new", "", ""), ("done", "True", ""), ("failed", "False", "X")):
        Artifact.objects.create(namespace=ns, name=name, resource_version=1, source="huggingFace",
                                resolved_status=status, resolved_reason=reason)  # fmt: skip
    long_ago = timezone.now() - timedelta(minutes=5)
    Artifact.objects.filter(namespace=ns).exclude(name="new").update(updated_at=long_ago)  # update() keeps it
    assert [n for s, n in retries.never_resolved(10_000) if s == ns] == ["lost"]


def test_it_resolves_again_once_per_requested_at_value(artifacts, hub, admin_http, cluster, mirror_db):
    from gpustack_models.models import Artifact, ResolveState

    repo = f"org/moving-{uuid.uuid4().hex[:6]}"
    first = hub.add_hf_repo(repo, {"config.json": b'{"v": 1}'})
    artifacts.create("moving", hf(repo))
    assert artifacts.answered("moving")["status"]["resolved"]["revision"] == first
    moved = hub.add_hf_commit(repo, {"config.json": b'{"v": 2}'})
    url = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{artifacts.ns}/modelartifacts/moving"

    def annotate(**labels):
        patch = {"metadata": {"annotations": {"worker.gpustack.ai/requested-at": "2026-12-01T00:00:00Z"}}}
        if labels:
            patch["metadata"]["labels"] = labels
        resp = admin_http.patch(url, json=patch, headers={"Content-Type": "application/merge-patch+json"})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["metadata"]["resourceVersion"])

    annotate()
    wait_for(lambda: artifacts.get("moving")["status"]["resolved"].get("revision") == moved, timeout=30,
             message="the moved branch to be resolved")  # fmt: skip
    wait_for(lambda: ResolveState.objects.filter(namespace=artifacts.ns, name="moving",
                                                 requested_at="2026-12-01T00:00:00Z").exists(),
             message="the request to be remembered")  # fmt: skip
    asked = len(hub.requests_matching(repo))
    touched = annotate(touched="yes")  # another event with the same value: not a new request
    # The worker mirrored that event, and so decided what to enqueue for it ...
    wait_for(lambda: Artifact.objects.filter(namespace=artifacts.ns, name="moving",
                                             resource_version__gte=touched).exists(),
             message="the touched artifact mirrored")  # fmt: skip
    # ... then an artifact created after it resolved: a resolution enqueued for that event came first.
    later = f"org/later-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(later, {"config.json": b"{}"})
    artifacts.create("later", hf(later))
    artifacts.answered("later")
    assert len(hub.requests_matching(repo)) == asked


def test_kubectl_describe_shows_resolution_events(artifacts, hub, kubectl):
    repo = f"org/described-{uuid.uuid4().hex[:6]}"
    commit = hub.add_hf_repo(repo, {"config.json": b"{}"})
    artifacts.create("good", hf(repo))
    artifacts.create("bad", hf(repo, "no-such-branch"))
    artifacts.answered("good")
    artifacts.answered("bad", reason="RevisionNotFound")

    def described(name, reason):
        out = kubectl("describe", "modelartifact", name, "-n", artifacts.ns).stdout
        return reason in out.split("Events:")[-1] and out

    good = wait_for(lambda: described("good", "Resolved"), message="the Resolved event")
    assert commit in good and "Normal" in good and "gpustack-models" in good, good
    bad = wait_for(lambda: described("bad", "ResolutionFailed"), message="the ResolutionFailed event")
    assert "Warning" in bad and "RevisionNotFound" in bad, bad


def test_it_reports_a_digest_mismatch(artifacts, hub):
    repo = f"org/d-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}"})
    artifacts.create("mismatch", hf(repo), expectedDigest="sha256:" + "0" * 64)
    obj = artifacts.answered("mismatch", reason="DigestMismatch")
    assert "resolved" not in obj["status"]


def test_it_resolves_a_claim_by_its_existence(artifacts, core):
    artifacts.create("claim", {"persistentVolumeClaim": {"claimName": "models", "path": "qwen"}})
    artifacts.answered("claim", reason="ClaimNotFound")
    core.create_namespaced_persistent_volume_claim(
        artifacts.ns,
        k8s.V1PersistentVolumeClaim(
            metadata=k8s.V1ObjectMeta(name="models"),
            spec=k8s.V1PersistentVolumeClaimSpec(
                access_modes=["ReadOnlyMany"], resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"})
            ),
        ),
    )
    obj = artifacts.answered("claim", timeout=60)
    assert "manifestDigest" not in obj["status"].get("resolved", {})


def test_it_never_lands_a_resolution_on_an_artifact_recreated_meanwhile(artifacts, hub, admin_http, cluster):
    old_files, new_files = repo_files("old-" + uuid.uuid4().hex), repo_files("new-" + uuid.uuid4().hex)
    old_repo, new_repo = f"org/old-{uuid.uuid4().hex[:6]}", f"org/new-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(old_repo, old_files)
    hub.add_hf_repo(new_repo, new_files)
    old_digest, new_digest = expected_digest(old_files), expected_digest(new_files)
    held = hub.faults.delay(f"/api/models/{old_repo}/tree", seconds=60)  # the first resolution, in flight
    try:
        artifacts.create("same", hf(old_repo))
        wait_for(lambda: held.hits == 1, timeout=30, message="the first resolution to reach the hub")
        url = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{artifacts.ns}/modelartifacts/same"
        first_uid = admin_http.get(url).json()["metadata"]["uid"]
        assert admin_http.delete(url).status_code == 200
        wait_for(lambda: admin_http.get(url).status_code == 404, timeout=30, message="the artifact to go")
        artifacts.create("same", hf(new_repo))
    finally:
        held.release()  # the old answer arrives now, for an object that no longer exists
    seen = set()

    def resolved_new():
        obj = artifacts.get("same")
        digest = (obj.get("status") or {}).get("resolved", {}).get("manifestDigest")
        seen.add(digest)
        return digest == new_digest and obj

    obj = wait_for(resolved_new, timeout=60, interval=0.1, message="the recreated artifact to resolve")
    assert obj["metadata"]["uid"] != first_uid
    # The old resolution finished (the hub answered it): keep watching a while for a late write.
    wait_for(lambda: any(r.path.startswith(f"/api/models/{old_repo}/tree") and r.status == 200
                         for r in hub.requests), timeout=30, message="the old resolution's answer")  # fmt: skip
    for _ in range(20):
        resolved_new()
    assert old_digest not in seen, "the old object's resolution landed on the new one"


@pytest.mark.django_db
def test_it_gives_each_namespace_its_own_share_of_the_hubs(settings):
    from gpustack_models.reconcilers import budgets

    settings.RESOLVE_NAMESPACE_RATE, settings.RESOLVE_NAMESPACE_BURST = 60.0, 3  # one a second, three at once
    started = time.monotonic()
    assert [budgets.take("greedy") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = budgets.take("greedy")
    took = time.monotonic() - started
    # The fourth waits for the next token: a second, less what the bucket refilled while the four were taken.
    assert 1.0 - took <= wait <= 1.0, f"waits {wait:.3f} s after {took:.3f} s"
    assert budgets.take("fair") == 0.0  # another namespace is untouched


def test_it_keeps_one_namespaces_broken_artifacts_from_using_up_the_hub(artifacts, hub, core):
    greedy = f"greedy-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=greedy)))
    broken = f"org/broken-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(broken, {"config.json": b"{}"})
    hub.faults.fail(broken, 503, times=None)  # retried with backoff, for ever
    try:
        for i in range(30):
            artifacts.create(f"b-{i:02d}", hf(broken), ns=greedy)
        files = repo_files("fair-" + uuid.uuid4().hex)
        fair = f"org/fair-{uuid.uuid4().hex[:6]}"
        hub.add_hf_repo(fair, files)
        artifacts.create("fair", hf(fair))
        assert artifacts.answered("fair", timeout=30)["status"]["resolved"]["manifestDigest"] == expected_digest(files)
        # The greedy namespace's attempts (one hub request each) until four past its burst of 10.
        asked = wait_for(lambda: (r := hub.requests_matching(broken)) and len(r) >= 14 and r, timeout=60,
                         interval=0.1, message="14 attempts of the greedy namespace")  # fmt: skip
        asked = sorted(asked, key=lambda r: r.started)[:14]
    finally:
        hub.faults.clear()
        core.delete_namespace(greedy)
    # Its share: a burst of 10, then 30 a minute, from a full bucket just before its first request; so the
    # 14th comes 8 s after the first. Without shares: 30 artifacts retried every 0.5-3 s, at once.
    window = asked[-1].started - asked[0].started
    assert len(asked) <= 10 + 30 * window / 60 + 1, f"{len(asked)} hub requests in {window:.1f} s"
