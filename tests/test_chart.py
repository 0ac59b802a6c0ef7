"""The Helm chart, with helm built from its Go module (``deploy/helm``): ``helm lint --strict``, ``helm
template`` with the default values and with cert-manager, every rendered object through kube-apiserver's
server-side dry run, and ``helm install``, ``upgrade`` and ``uninstall`` against a control plane of its own
(the suite's has the local worker's APIService and RBAC, which the chart would collide with)."""

from __future__ import annotations

import base64
import functools
import json
import subprocess
import threading

import pytest
import yaml

from gpustack_models.local.cluster import LocalCluster, Ports
from tests.support import REPO, TEST_STATE, wait_for
from tests.support.helm import CHART, helm_test_account
from tests.support.helm import run_helm as helm_in_test_state
from tests.support.kubernetes import kubectl_run

NS = "models-system"
RELEASE = "models"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CERT_MANAGER = ["--set", "certManager.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"]

# What the chart installs besides its CRDs: every role, the aggregation, the webhook, the CSI driver,
# RBAC, the admission policies, the certificates and the NetworkPolicies.
EXPECTED = {
    ("Deployment", "gpustack-models-api"),
    ("Deployment", "gpustack-models-informers"),
    ("Deployment", "gpustack-models-worker"),
    ("Deployment", "gpustack-models-beat"),
    ("Deployment", "gpustack-models-console"),
    ("DaemonSet", "gpustack-models-plugin"),
    ("Job", "gpustack-models-migrate-1"),
    ("Service", "gpustack-models-api"),
    ("APIService", "v1.worker.gpustack.ai"),
    ("MutatingWebhookConfiguration", "gpustack-models-placement"),
    ("ValidatingWebhookConfiguration", "gpustack-models-volumes"),
    ("CSIDriver", "model.csi.gpustack.ai"),
    ("ServiceAccount", "gpustack-models-worker"),
    ("ServiceAccount", "gpustack-models-plugin"),
    ("ServiceAccount", "gpustack-models-console"),
    ("ClusterRole", "gpustack-models-worker"),
    ("ClusterRole", "gpustack-models-plugin"),
    ("ClusterRole", "gpustack-models-tenant-reader"),  # for administrators to bind; the chart binds neither
    ("ClusterRole", "gpustack-models-tenant-editor"),
    ("ValidatingAdmissionPolicy", "gpustack-models-storage-writes"),
    ("ValidatingAdmissionPolicy", "gpustack-models-status-writes"),
    ("ValidatingAdmissionPolicy", "gpustack-models-model-volumes"),
    ("Secret", "gpustack-models-api-serving"),
    ("Secret", "gpustack-models-plugin-ca"),
    ("Secret", "gpustack-models-secret-key"),
    ("ConfigMap", "gpustack-models-ca"),
    ("NetworkPolicy", "gpustack-models-plugin"),
    ("NetworkPolicy", "gpustack-models-api"),
    ("NetworkPolicy", "gpustack-models-background"),
    ("NetworkPolicy", "gpustack-models-console"),
}


class ChartCluster:
    """The chart's control plane, started in a thread of its own while the render tests run (they need none). The
    thread lives as long as the control plane: its processes stop when the thread that started them ends."""

    def __init__(self, bin_dir):
        state = TEST_STATE / "chart-cluster"
        LocalCluster(state).wipe()
        self.lc = LocalCluster(state, ports=Ports.free(), bin_dir=bin_dir)
        self.ready, self.done = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chart-cluster", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.lc.start()
        except BaseException as exc:  # raised again by wait()
            self.error = exc
        finally:
            self.ready.set()
        self.done.wait()
        self.lc.stop()

    def wait(self) -> LocalCluster:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return self.lc

    def stop(self):
        self.done.set()
        self.thread.join()


@pytest.fixture(scope="module", autouse=True)
def chart_cluster_starting(cluster):
    """Starts the chart's control plane as the module begins."""
    starting = ChartCluster(cluster.bin_dir)
    try:
        yield starting
    finally:
        starting.stop()


@pytest.fixture(scope="module")
def chart_cluster(chart_cluster_starting):
    """A control plane of the chart's own (the suite's has the local worker's APIService and RBAC)."""
    return chart_cluster_starting.wait()


def run_helm(helm: str, *args: str, lc: LocalCluster | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return helm_in_test_state(helm, *args, kubeconfig=lc.kubeconfig if lc else None, check=check)


@functools.cache
def template(helm: str, *values: str) -> str:
    """``helm template`` of the release with ``values``: rendered once, the tests only read it."""
    return run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, *values).stdout


def render(helm: str, *values: str) -> list[dict]:
    return [doc for doc in yaml.load_all(template(helm, *values), Loader=LOADER) if doc]


def by_kind(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- lint and template -----------------------------------------------------------------------------------
def test_lint_strict_passes_with_the_default_values_and_with_cert_manager(helm):
    for values in ([], CERT_MANAGER):
        out = run_helm(helm, "lint", "--strict", str(CHART), *values)
        assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout, out.stdout


def test_the_schema_refuses_a_bad_value_naming_it(helm):
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", "plugin.port=70000", check=False)
    assert proc.returncode != 0
    assert "plugin" in proc.stderr and "port" in proc.stderr, proc.stderr
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", "api.nosuchvalue=1", check=False)
    assert proc.returncode != 0 and "nosuchvalue" in proc.stderr, proc.stderr


def test_the_default_render_has_every_part_and_one_serving_ca(helm):
    objects = render(helm)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert names >= EXPECTED, EXPECTED - names
    serving = by_kind(objects, "Secret", "gpustack-models-api-serving")["data"]
    ca = serving["ca.crt"]
    # The APIService and the webhook trust the CA that signed the serving certificate in the same render.
    assert by_kind(objects, "APIService", "v1.worker.gpustack.ai")["spec"]["caBundle"] == ca
    webhook = by_kind(objects, "MutatingWebhookConfiguration", "gpustack-models-placement")["webhooks"][0]
    assert webhook["clientConfig"]["caBundle"] == ca
    assert webhook["clientConfig"]["service"] == {
        "namespace": NS,
        "name": "gpustack-models-api",
        "path": "/internal/v1/placement",
        "port": 443,
    }
    # Namespaced objects land in the release's namespace; the policies know the worker there.
    # (kube-system only for reading the authentication configuration, as every aggregated server does).
    elsewhere = {(o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"].get("namespace", NS) != NS}
    assert elsewhere == {("RoleBinding", "gpustack-models-worker:authentication-reader")}
    policy = by_kind(objects, "ValidatingAdmissionPolicy", "gpustack-models-storage-writes")
    assert f"system:serviceaccount:{NS}:gpustack-models-worker" in json.dumps(policy)


def test_only_the_api_holds_the_plugin_ca_key_and_the_plugin_runs_as_the_design_says(helm):
    objects = render(helm)
    for o in objects:
        if o["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        secrets = [
            (v["secret"]["secretName"], tuple(i["key"] for i in v["secret"].get("items", [])))
            for v in o["spec"]["template"]["spec"].get("volumes", [])
            if "secret" in v
        ]
        with_key = [s for s in secrets if s[0] == "gpustack-models-plugin-ca" and "tls.key" in s[1]]
        assert bool(with_key) == (o["metadata"]["name"] == "gpustack-models-api"), (o["metadata"]["name"], secrets)
        assert all(s[1] for s in secrets if s[0] == "gpustack-models-plugin-ca"), "the whole CA Secret mounted"
    plugin = by_kind(objects, "DaemonSet", "gpustack-models-plugin")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in plugin["containers"]}
    assert set(containers) == {"mounter", "plugin"}
    mounter, container = containers["mounter"], containers["plugin"]
    # Only the mounter is privileged (and mounts the kubelet's directory); what parses network input is not.
    assert {m["name"]: m for m in mounter["volumeMounts"]}["kubelet"]["mountPropagation"] == "Bidirectional"
    assert mounter["securityContext"]["privileged"] is True and mounter["securityContext"]["runAsUser"] == 0
    assert "--role" in container["command"] and "node" in container["command"] and "mounter" in mounter["command"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0 and not context.get("privileged")
    assert context["capabilities"] == {"drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert "kubelet" not in {m["name"] for m in container["volumeMounts"]}
    (owner,) = plugin["initContainers"]
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert owner["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    env = {e["name"]: e for e in container["env"]}
    # The plugin runs without Django: no key of any kind, no database, no broker.
    mounter_env = {e["name"] for e in mounter["env"]}
    assert not {"SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} & (set(env) | mounter_env)
    # No token for its peers (they present client certificates the API issues): no projected volume.
    assert not [v for v in plugin["volumes"] if "projected" in v]
    workers = [o for o in objects if o["kind"] == "Deployment"]
    for deployment in workers:
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"]


def test_cert_manager_renders_certificates_and_injection_instead_of_generated_secrets(helm):
    objects = render(helm, *CERT_MANAGER)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Certificate", "gpustack-models-api-serving") in names
    assert ("Certificate", "gpustack-models-plugin-ca") in names
    assert ("Issuer", "gpustack-models-selfsigned") in names
    assert ("ServiceMonitor", "gpustack-models") in names
    reader = by_kind(objects, "ClusterRole", "gpustack-models:metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not {("Secret", "gpustack-models-api-serving"), ("Secret", "gpustack-models-plugin-ca")} & names
    apiservice = by_kind(objects, "APIService", "v1.worker.gpustack.ai")
    assert "caBundle" not in apiservice["spec"]
    inject = f"{NS}/gpustack-models-api-serving"
    assert apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == inject
    webhook = by_kind(objects, "MutatingWebhookConfiguration", "gpustack-models-placement")
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == inject


# --- against a control plane -----------------------------------------------------------------------------
def kubectl(lc: LocalCluster, *args: str, check: bool = True, input: str | None = None):
    return kubectl_run(lc, *args, check=check, input=input, cache_dir=str(TEST_STATE / "chart-kube-cache"))


def test_every_rendered_object_passes_a_server_side_dry_run(helm, chart_cluster):
    kubectl(chart_cluster, "apply", "--server-side", "-f", str(CHART / "crds"))
    kubectl(chart_cluster, "create", "namespace", NS, check=False)
    kubectl(
        chart_cluster, "apply", "-f", "-", input=helm_test_account(NS, RELEASE)
    )  # the test Pod's (a dry run makes none)
    text = template(helm)
    out = kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=text).stdout
    applied = [line for line in out.splitlines() if line.strip()]
    assert len(applied) == len(render(helm)), out
    assert all("(server dry run)" in line for line in applied), out


def test_the_cert_manager_render_passes_a_server_side_dry_run_with_cert_managers_crds(helm, chart_cluster):
    """With cert-manager's own CRDs (its Go module, pinned in deploy/cert-manager) the Issuers and Certificates
    are checked by kube-apiserver too. (The ServiceMonitor's CRD is not in any module the proxy serves: it is
    checked by the render only.)"""
    script = REPO / "deploy" / "cert-manager" / "crds.sh"
    crds = subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    kubectl(chart_cluster, "apply", "--server-side", "-f", crds)
    kubectl(chart_cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(chart_cluster, "create", "namespace", NS, check=False)
    kubectl(chart_cluster, "apply", "-f", "-", input=helm_test_account(NS, RELEASE))
    text = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NS, "--set", "certManager.enabled=true"
    ).stdout
    rendered = [d for d in yaml.load_all(text, Loader=LOADER) if d]
    assert {d["kind"] for d in rendered} >= {"Certificate", "Issuer", "APIService"}
    out = kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=text).stdout
    applied = [line for line in out.splitlines() if line.strip()]
    assert len(applied) == len(rendered) and all("(server dry run)" in line for line in applied), out


def resource(obj: dict) -> str:
    """``kind.version.group`` as kubectl names a resource (the kind alone in the core group)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    return f"{obj['kind'].lower()}.{version}.{group}" if group else obj["kind"].lower()


CRDS = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}
STORES = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "NodeModelStore"}


def listing(lc: LocalCluster, *resources: str) -> dict[tuple[str, str, str], dict]:
    """Every object of ``resources`` in every namespace, from one ``kubectl get``, by (kind, name, namespace)
    (a cluster-scoped object's namespace is the release's, as in ``installed``)."""
    out = kubectl(lc, "get", ",".join(sorted(set(resources))), "-A", "-o", "json").stdout
    items = json.loads(out)["items"]
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", NS)): o for o in items}


ATTRIBUTES = ("verb", "group", "resource", "namespace")  # an empty one (the core group, all namespaces) omitted


def tenant_answers(lc: LocalCluster, who: list[str], checks) -> list[tuple]:
    """SelfSubjectAccessReviews for ``checks`` (verb, group, resource, namespace) as ``who`` (impersonated, as
    ``kubectl auth can-i --as`` asks), created together: each check with kube-apiserver's answer."""
    reviews = [
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {k: v for k, v in zip(ATTRIBUTES, check, strict=True) if v}},
        }
        for check in checks
    ]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": reviews})
    out = kubectl(lc, "create", *who, "-f", "-", "-o", "json", input=text).stdout
    answered, decoder, at = [], json.JSONDecoder(), 0  # one JSON document per review, in order
    while out[at:].strip():
        review, at = decoder.raw_decode(out, len(out) - len(out[at:].lstrip()))
        answered.append(review)
    assert [a["spec"]["resourceAttributes"] for a in answered] == [r["spec"]["resourceAttributes"] for r in reviews]
    return [(check, a["status"]) for check, a in zip(checks, answered, strict=True)]


def test_install_upgrade_and_uninstall(helm, chart_cluster):
    lc = chart_cluster
    # --no-hooks: no node runs the hooks' Pods on this control plane (tests/test_hooks.py runs their commands;
    # tests/test_chart_hooks.py renders them).
    run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", "--no-hooks", lc=lc)
    manifest = run_helm(helm, "get", "manifest", RELEASE, "--namespace", NS, lc=lc).stdout
    objects = [o for o in yaml.load_all(manifest, Loader=LOADER) if o]
    installed = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", NS)) for o in objects}
    assert {(kind, name) for kind, name, _ in installed} >= EXPECTED
    resources = {resource(o) for o in objects}
    found = listing(lc, *resources, resource(CRDS))
    assert installed <= set(found), installed - set(found)
    crds = {f"{crd}.worker.gpustack.ai" for crd in ("modelartifacts", "nodemodelstores", "modelprefetches")}
    assert crds <= {name for kind, name, _ in found if kind == "CustomResourceDefinition"}

    apiservice = found[("APIService", "v1.worker.gpustack.ai", NS)]
    assert apiservice["spec"]["service"] == {"namespace": NS, "name": "gpustack-models-api", "port": 443}
    serving, plugin_ca, key = (
        found[("Secret", n, NS)]["data"]
        for n in ("gpustack-models-api-serving", "gpustack-models-plugin-ca", "gpustack-models-secret-key")
    )
    assert apiservice["spec"]["caBundle"] == serving["ca.crt"]
    # The nodes' CA certificates, in a ConfigMap: the same CAs, no key.
    cas = found[("ConfigMap", "gpustack-models-ca", NS)]["data"]
    assert b64(cas["api-ca.crt"]) == serving["ca.crt"] and b64(cas["plugin-ca.crt"]) == plugin_ca["tls.crt"]

    # The chart grants tenants nothing: an authenticated user and a tenant's ServiceAccount may do nothing
    # with the group's resources, in their namespace or cluster-wide, nor read the chart's Secrets.
    group = "worker.gpustack.ai"
    checks = [
        ("create", group, "modelartifacts", "team-a"),
        ("list", group, "modelartifacts", ""),
        ("get", group, "nodemodelstores", ""),
        ("create", group, "modelprefetches", "team-a"),
        ("get", "", "secrets", NS),
        ("create", "", "pods", NS),
    ]
    for who in (["--as=alice", "--as-group=system:authenticated"], ["--as=system:serviceaccount:team-a:default"]):
        for check, status in tenant_answers(lc, who, checks):
            assert status["allowed"] is False, (who, check, status)

    # An object the worker wrote (the admission policy lets only it create) must outlive the release.
    worker = f"system:serviceaccount:{NS}:gpustack-models-worker"
    store = {**STORES, "metadata": {"name": "chart-node"}, "spec": {"models": []}}
    kubectl(lc, "create", f"--as={worker}", "-f", "-", input=json.dumps(store))

    run_helm(helm, "upgrade", RELEASE, str(CHART), "--namespace", NS, "--set", "api.replicas=3", "--no-hooks", lc=lc)
    found = listing(lc, "secret", "configmap", "apiservice.v1.apiregistration.k8s.io", "deployment.v1.apps")
    assert found[("ConfigMap", "gpustack-models-ca", NS)]["data"] == cas
    assert found[("Secret", "gpustack-models-api-serving", NS)]["data"] == serving
    assert found[("Secret", "gpustack-models-plugin-ca", NS)]["data"] == plugin_ca
    assert found[("Secret", "gpustack-models-secret-key", NS)]["data"] == key
    assert found[("APIService", "v1.worker.gpustack.ai", NS)]["spec"]["caBundle"] == serving["ca.crt"]
    assert found[("Deployment", "gpustack-models-api", NS)]["spec"]["replicas"] == 3

    run_helm(helm, "uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "120s", "--no-hooks", lc=lc)

    def left():
        return installed & set(listing(lc, *resources))

    try:
        wait_for(lambda: not left(), timeout=60, message="the release's objects to go")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {sorted(left())}") from None
    found = listing(lc, resource(CRDS), resource(STORES))
    assert crds <= {name for kind, name, _ in found if kind == "CustomResourceDefinition"}
    assert ("NodeModelStore", "chart-node", NS) in found
