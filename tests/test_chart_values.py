"""The chart's day-2 values, from ``helm template``: each role's placement and Pod metadata land on its own Pods
only, the plugin's default placement on Linux GPU nodes, the PodDisruptionBudgets (only while a role has more
than one replica), cert-manager's lifetimes and an existing issuer, certificates from Secrets the operator made,
``global``; ``helm lint --strict`` in every mode, and kube-apiserver's server-side dry run of what they render
(the chart's control plane of ``tests/test_chart.py``)."""

from __future__ import annotations

import base64
import datetime
import functools
import json
import subprocess

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import REPO
from tests.support.helm import CHART, helm_test_account
from tests.test_chart import LOADER, NS, RELEASE, ChartCluster, by_kind, kubectl, render, run_helm, template

ROLES = ("api", "informers", "worker", "beat", "console")
OWNERS = {
    **{r: ("Deployment", f"gpustack-models-{r}") for r in ROLES},
    "plugin": ("DaemonSet", "gpustack-models-plugin"),
}
OWNERS["migrate"] = ("Job", "gpustack-models-migrate-1")
SELECTOR = ("app.kubernetes.io/name", "app.kubernetes.io/instance")


@pytest.fixture(scope="module", autouse=True)
def chart_cluster_starting(cluster):
    """The chart's own control plane (as in tests/test_chart.py), starting while the render tests run."""
    starting = ChartCluster(cluster.bin_dir)
    try:
        yield starting
    finally:
        starting.stop()


@pytest.fixture(scope="module")
def chart_cluster(chart_cluster_starting):
    return chart_cluster_starting.wait()


def sets(values: dict) -> tuple[str, ...]:
    """``--set-json`` arguments for ``values`` ({dotted path: value})."""
    return tuple(arg for path, value in values.items() for arg in ("--set-json", f"{path}={json.dumps(value)}"))


@functools.cache
def ca_pem() -> str:
    """A CA certificate as an operator would have made one (its key thrown away)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def existing(serving: bool = True, plugin: bool = True, ca: bool = True) -> tuple[str, ...]:
    values = {}
    if serving:
        values["certificates.apiServing.existingSecret"] = "operator-serving"
        if ca:
            values["certificates.apiServing.caBundle"] = ca_pem()
    if plugin:
        values["certificates.pluginCA.existingSecret"] = "operator-plugin-ca"
    return sets(values)


CERT_MANAGER = ("--set", "certManager.enabled=true")
LIFETIMES = sets({
    "certManager.ca": {"duration": "8760h", "renewBefore": "720h"},
    "certManager.serving": {"duration": "2160h", "renewBefore": "360h"},
    "certManager.issuerRef": {"name": "corporate", "kind": "ClusterIssuer"},
})  # fmt: skip


def placement(role: str) -> dict:
    """Values of one role's placement and Pod metadata, each naming the role."""
    term = {"matchExpressions": [{"key": f"pool-{role}", "operator": "Exists"}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return {
        f"{role}.priorityClassName": f"priority-{role}",
        f"{role}.nodeSelector": {"pool": role},
        f"{role}.tolerations": [{"key": f"taint-{role}", "operator": "Exists"}],
        f"{role}.affinity": {"nodeAffinity": required},
        f"{role}.podAnnotations": {"example.com/role": role},
        f"{role}.podLabels": {"example.com/role": role, "app.kubernetes.io/component": "overridden"},
    }  # fmt: skip


EVERY_ROLE = sets({k: v for role in (*ROLES, "plugin", "migrate") for k, v in placement(role).items()})
STRATEGIES = sets({
    **{f"{r}.strategy": {"rollingUpdate": {"maxUnavailable": f"{i}%"}} for i, r in enumerate(ROLES)},
    "plugin.updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "5%"}},
})  # fmt: skip
MODES = {
    "defaults": (),
    "every role placed": EVERY_ROLE + STRATEGIES,
    "cert-manager lifetimes and issuer": CERT_MANAGER + LIFETIMES,
    "existing secrets": existing(),
    "existing secrets and cert-manager": CERT_MANAGER + existing(),
    "existing serving only": existing(plugin=False),
    "existing plugin CA only": existing(serving=False),
    "no budgets, one replica": sets({"api.podDisruptionBudget.enabled": False, "informers.replicas": 1}),
    "a parent chart's global": sets({"global": {"imageRegistry": "example.com"}}),
}


def spec_of(objects, role: str) -> dict:
    return by_kind(objects, *OWNERS[role])["spec"]


def pod_of(objects, role: str) -> dict:
    return spec_of(objects, role)["template"]


@pytest.mark.parametrize("mode", MODES)
def test_lint_strict_passes_in_every_mode(helm, mode):
    out = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NS, *MODES[mode])
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout, out.stdout


def test_each_role_gets_its_own_placement_and_pod_metadata_and_no_other_roles(helm):
    objects = render(helm, *EVERY_ROLE)
    default = render(helm)
    for role in OWNERS:
        pod, before = pod_of(objects, role), pod_of(default, role)
        spec = pod["spec"]
        assert spec["priorityClassName"] == f"priority-{role}", role
        assert spec["nodeSelector"]["pool"] == role, role
        assert {"key": f"taint-{role}", "operator": "Exists"} in spec["tolerations"], role
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": f"pool-{role}", "operator": "Exists"}]}], role
        assert pod["metadata"]["annotations"]["example.com/role"] == role
        labels = pod["metadata"]["labels"]
        assert labels["example.com/role"] == role
        # The chart's own labels win over podLabels, and the selector still matches the Pods.
        assert labels["app.kubernetes.io/component"] == before["metadata"]["labels"]["app.kubernetes.io/component"]
        assert {k: v for k, v in labels.items() if k != "example.com/role"} == before["metadata"]["labels"], role
        if role != "migrate":
            assert spec_of(objects, role)["selector"]["matchLabels"].items() <= labels.items(), role
    # The API keeps its default preference away from plugin nodes beside the affinity added.
    api = pod_of(objects, "api")["spec"]["affinity"]
    assert api["podAntiAffinity"] == pod_of(default, "api")["spec"]["affinity"]["podAntiAffinity"]


def test_pod_labels_cannot_name_the_selector_labels(helm):
    for role in ("api", "plugin", "migrate"):
        for key in SELECTOR:
            values = sets({f"{role}.podLabels": {key: "elsewhere"}})
            proc = run_helm(helm, "template", RELEASE, str(CHART), *values, check=False)
            assert proc.returncode != 0 and f"/{role}/podLabels" in proc.stderr, proc.stderr


def test_the_api_surges_on_upgrade_and_spreads_over_nodes_and_strategies_are_values(helm):
    objects = render(helm)
    assert spec_of(objects, "api")["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    (spread,) = pod_of(objects, "api")["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {SELECTOR[0]: "gpustack-models-api", SELECTOR[1]: RELEASE}},
    }  # fmt: skip
    assert all("strategy" not in spec_of(objects, r) for r in ROLES if r != "api")
    objects = render(helm, *STRATEGIES)
    for i, role in enumerate(ROLES):
        assert spec_of(objects, role)["strategy"]["rollingUpdate"]["maxUnavailable"] == f"{i}%", role
    rolling = spec_of(objects, "plugin")["updateStrategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 0, "maxSurge": "5%"}


def test_the_plugin_defaults_to_linux_gpu_nodes_a_tenth_at_a_time(helm):
    objects = render(helm)
    plugin = spec_of(objects, "plugin")
    assert plugin["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    spec = plugin["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    # A cluster without the GPU feature discovery label names its own nodes and drops the default's.
    values = sets({"plugin.nodeSelector": {"pool": "gpu", "nvidia.com/gpu.present": None}})
    spec = pod_of(render(helm, *values), "plugin")["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "gpu"}
    # Two plugin Pods on one node's network would bind the same ports: a surge is refused there.
    surge = sets(
        {"plugin.hostNetwork": True, "plugin.updateStrategy.rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    )
    proc = run_helm(helm, "template", RELEASE, str(CHART), *surge, check=False)
    assert proc.returncode != 0 and "plugin.updateStrategy.rollingUpdate.maxSurge" in proc.stderr, proc.stderr


def budgets(objects) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PodDisruptionBudget"}


def test_disruption_budgets_render_only_for_roles_with_more_than_one_replica(helm):
    objects = render(helm)
    found = budgets(objects)
    assert set(found) == {"gpustack-models-api", "gpustack-models-informers", "gpustack-models-beat"}
    for name, spec in found.items():
        role = name.removeprefix("gpustack-models-")
        assert spec == {
            "selector": spec_of(objects, role)["selector"],
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        }, name
        assert spec["selector"]["matchLabels"].items() <= pod_of(objects, role)["metadata"]["labels"].items()
    one = sets({"api.replicas": 1, "informers.replicas": 1, "beat.replicas": 1})
    assert budgets(render(helm, *one)) == {}
    tuned = sets({
        "api.replicas": 3,
        "api.podDisruptionBudget": {"minAvailable": 2, "unhealthyPodEvictionPolicy": "IfHealthyBudget"},
        "informers.podDisruptionBudget.enabled": False, "beat.podDisruptionBudget.maxUnavailable": "50%",
    })  # fmt: skip
    found = budgets(render(helm, *tuned))
    assert set(found) == {"gpustack-models-api", "gpustack-models-beat"}
    assert found["gpustack-models-api"]["minAvailable"] == 2 and "maxUnavailable" not in found["gpustack-models-api"]
    assert found["gpustack-models-api"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    assert found["gpustack-models-beat"]["maxUnavailable"] == "50%"


@pytest.mark.parametrize(
    "values,named",
    [
        (sets({"global": {"anything": {"a": 1}}}), None),
        (sets({"migrate.nosuchvalue": 1}), "nosuchvalue"),
        (sets({"certificates.apiServing.nosuchvalue": 1}), "nosuchvalue"),
        (sets({"api.podDisruptionBudget.nosuchvalue": 1}), "nosuchvalue"),
        (sets({"plugin.updateStrategy.rollingUpdate.maxUnavailable": "ten"}), "maxUnavailable"),
        (sets({"certManager.serving.duration": "90 days"}), "duration"),
        (sets({"certManager.issuerRef": {"kind": "ClusterIssuer"}}), "issuerRef"),
        (sets({"nosuchsection": {}}), "nosuchsection"),
    ],
)
def test_global_is_allowed_at_the_root_and_everything_else_stays_strict(helm, values, named):
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values, check=False)
    if named is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and named in proc.stderr, proc.stderr


def api_container(objects) -> dict:
    (api,) = pod_of(objects, "api")["spec"]["containers"]
    return api


def test_cert_manager_lifetimes_and_an_existing_cluster_issuer(helm):
    objects = render(helm, *CERT_MANAGER, *LIFETIMES)
    certificates = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Certificate"}
    issuer = {"name": "corporate", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    for name in ("gpustack-models-api-ca", "gpustack-models-plugin-ca"):
        assert certificates[name]["duration"] == "8760h" and certificates[name]["renewBefore"] == "720h", name
        assert certificates[name]["issuerRef"] == issuer, name
    serving = certificates["gpustack-models-api-serving"]
    assert serving["duration"] == "2160h" and serving["renewBefore"] == "360h"
    assert serving["issuerRef"] == {"name": "gpustack-models-api-ca", "kind": "Issuer"}
    assert not [o for o in objects if o["kind"] == "Issuer" and o["metadata"]["name"] == "gpustack-models-selfsigned"]
    # By default: cert-manager's lifetimes (none written) and a self-signed Issuer for the CAs.
    objects = render(helm, *CERT_MANAGER)
    assert not [o for o in objects if o["kind"] == "Certificate" and {"duration", "renewBefore"} & set(o["spec"])]
    assert by_kind(objects, "Certificate", "gpustack-models-plugin-ca")["spec"]["issuerRef"] == {
        "name": "gpustack-models-selfsigned", "kind": "Issuer"
    }  # fmt: skip


@pytest.mark.parametrize("manager", [(), CERT_MANAGER], ids=["generated", "cert-manager"])
def test_existing_secrets_replace_the_charts_and_cert_managers_certificates(helm, manager):
    objects = render(helm, *manager, *existing())
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not {k for k in kinds if k[0] in ("Certificate", "Issuer")}, kinds
    secrets = {name for kind, name in kinds if kind == "Secret"}
    assert secrets == {"gpustack-models-secret-key"}
    # The API mounts the operator's Secrets; the APIService and webhook trust the CA the values give.
    volumes = {v["name"]: v.get("secret") for v in pod_of(objects, "api")["spec"]["volumes"]}
    assert volumes["serving"] == {"secretName": "operator-serving"}
    assert volumes["plugin-ca"]["secretName"] == volumes["plugin-ca-key"]["secretName"] == "operator-plugin-ca"
    bundle = base64.b64encode(ca_pem().encode()).decode()
    apiservice = by_kind(objects, "APIService", "v1.worker.gpustack.ai")
    assert apiservice["spec"]["caBundle"] == bundle
    assert "cert-manager.io/inject-ca-from" not in apiservice["metadata"]["annotations"]
    webhook = by_kind(objects, "MutatingWebhookConfiguration", "gpustack-models-placement")
    assert webhook["webhooks"][0]["clientConfig"]["caBundle"] == bundle
    # The chart does not know the CAs in the operator's Secrets: the API publishes the nodes' ConfigMap.
    assert ("ConfigMap", "gpustack-models-ca") not in kinds
    assert ("Role", "gpustack-models-worker:ca-publisher") in kinds
    env = {e["name"]: e.get("value") for e in api_container(objects)["env"]}
    assert env["GPUSTACK_CA_CONFIGMAP"] == "gpustack-models-ca"
    assert env["GPUSTACK_API_SERVING_CA_FILE"] == "/etc/gpustack-models/serving/ca.crt"
    # Rotations in place reach the API as files (it reloads them): no checksum rolls its Pods.
    assert "checksum/pki" not in (pod_of(objects, "api")["metadata"].get("annotations") or {})


def test_one_existing_secret_keeps_the_other_certificate_generated(helm):
    objects = render(helm, *existing(plugin=False))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Secret", "gpustack-models-plugin-ca") in kinds and ("Secret", "gpustack-models-api-serving") not in kinds
    objects = render(helm, *existing(serving=False))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Secret", "gpustack-models-api-serving") in kinds and ("Secret", "gpustack-models-plugin-ca") not in kinds
    serving = by_kind(objects, "Secret", "gpustack-models-api-serving")["data"]["ca.crt"]
    assert by_kind(objects, "APIService", "v1.worker.gpustack.ai")["spec"]["caBundle"] == serving
    assert ("ConfigMap", "gpustack-models-ca") not in kinds  # a CA the chart does not know: the API publishes


def test_only_the_charts_own_pki_has_a_checksum_that_rolls_the_api(helm):
    def checksum(*values):
        return (pod_of(render(helm, *values), "api")["metadata"].get("annotations") or {}).get("checksum/pki")

    assert checksum() is not None  # the PKI the chart generated (anew only when its Secret is gone)
    assert checksum(*CERT_MANAGER) is None
    other_ca = sets({"certificates.apiServing.caBundle": ca_pem() + ca_pem()})
    assert checksum(*existing()) is None and checksum(*existing(), *other_ca) is None


def test_an_existing_serving_secret_needs_its_ca_and_never_a_key(helm):
    proc = run_helm(helm, "template", RELEASE, str(CHART), *existing(ca=False), check=False)
    assert proc.returncode != 0 and "certificates.apiServing.caBundle" in proc.stderr, proc.stderr
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with_key = sets({"certificates.apiServing.caBundle": ca_pem() + key.decode()})
    proc = run_helm(helm, "template", RELEASE, str(CHART), *existing(ca=False), *with_key, check=False)
    assert proc.returncode != 0 and "caBundle" in proc.stderr and "PRIVATE KEY" not in proc.stdout, proc.stderr


# --- against a control plane -----------------------------------------------------------------------------
def test_every_mode_passes_a_server_side_dry_run(helm, chart_cluster):
    script = REPO / "deploy" / "cert-manager" / "crds.sh"
    crds = subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    kubectl(chart_cluster, "apply", "--server-side", "-f", str(CHART / "crds"), "-f", crds)
    kubectl(chart_cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(chart_cluster, "create", "namespace", NS, check=False)
    kubectl(
        chart_cluster, "apply", "-f", "-", input=helm_test_account(NS, RELEASE)
    )  # the test Pod's (a dry run makes none)
    for mode, values in MODES.items():
        objects = render(helm, *values)
        text = template(helm, *values)
        out = kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=text).stdout
        applied = [line for line in out.splitlines() if line.strip()]
        assert len(applied) == len(objects) and all("(server dry run)" in line for line in applied), (mode, out)


def test_an_existing_serving_secrets_ca_is_read_from_the_cluster_at_install(helm, chart_cluster):
    """Without certificates.apiServing.caBundle, the chart reads the Secret's ca.crt (lookup) when it renders
    against the cluster (install, upgrade, or a server dry run as here)."""
    kubectl(chart_cluster, "create", "namespace", NS, check=False)
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "operator-serving", "namespace": NS},
        "stringData": {"tls.crt": ca_pem(), "tls.key": "not used here", "ca.crt": ca_pem()},
    }  # fmt: skip
    kubectl(chart_cluster, "apply", "--server-side", "-f", "-", input=json.dumps(secret))
    args = ("template", RELEASE, str(CHART), "--namespace", NS, "--dry-run=server", *existing(ca=False))
    text = run_helm(helm, *args, lc=chart_cluster).stdout
    apiservice = by_kind([d for d in yaml.load_all(text, Loader=LOADER) if d], "APIService", "v1.worker.gpustack.ai")
    assert apiservice["spec"]["caBundle"] == base64.b64encode(ca_pem().encode()).decode()


def test_the_api_policy_keeps_the_plugins_in_when_api_from_narrows_it(helm):
    """``networkPolicy.apiFrom`` narrows who reaches the API's port; the plugins, which ask it for their
    certificates, tickets and mounts, stay allowed (before: naming any peer shut them out)."""
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    values = sets({"networkPolicy.apiFrom": [peer]})
    (policy,) = [
        o
        for o in render(helm, *values)
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "gpustack-models-api"
    ]
    (rule,) = policy["spec"]["ingress"]
    plugin = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "gpustack-models-plugin", "app.kubernetes.io/instance": RELEASE}
        }
    }
    assert rule["from"] == [peer, plugin], rule
    (open_rule,) = next(
        o for o in render(helm) if o["metadata"]["name"] == "gpustack-models-api" and o["kind"] == "NetworkPolicy"
    )["spec"]["ingress"]
    assert "from" not in open_rule, (
        open_rule
    )  # empty apiFrom: anyone (kube-apiserver comes from outside the Pod network)
