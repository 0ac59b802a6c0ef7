"""What a node, or anything in the cluster, reaches of the chart's release, from ``helm template``.

A node's kubelet may read every Secret that a Pod bound to it references (the Node authorizer), whole: a
volume's ``items`` limits only what is mounted. So the Secrets holding keys must be referenced by the API's
Pods alone (kept off the GPU nodes), and the plugin, on every GPU node, references no Secret at all. The
console has no Kubernetes token; the console and the metrics ports admit only the peers the values name.
``tests/test_chart_node.py`` asks the real node's kubelet identity for the keys."""

from __future__ import annotations

import base64
import functools
import json

import yaml

from tests.support.chart import key_bearing, pod_specs, referenced_secrets
from tests.support.helm import CHART, run_helm

NS = "models-system"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CERT_MANAGER = ("--set", "certManager.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
SCRAPER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
STAFF = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
# Certificates from Secrets the operator made (the chart renders nothing for them): they hold keys too.
OPERATOR_CA = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n"  # rendered into caBundle only
EXISTING_SERVING = (
    *("--set", "certificates.apiServing.existingSecret=operator-serving"),
    *("--set", f"certificates.apiServing.caBundle={OPERATOR_CA}"),
)
EXISTING_PLUGIN_CA = ("--set", "certificates.pluginCA.existingSecret=operator-ca")
EXISTING = EXISTING_SERVING + EXISTING_PLUGIN_CA
PEERS = ("--set-json", f"metrics.from={json.dumps([SCRAPER])}", "--set-json", f"console.from={json.dumps([STAFF])}")


@functools.cache
def render(helm: str, *values: str) -> tuple[dict, ...]:
    text = run_helm(helm, "template", "models", str(CHART), "--namespace", NS, *values).stdout
    return tuple(doc for doc in yaml.load_all(text, Loader=LOADER) if doc)


def one(objects, kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_only_the_api_pods_reference_a_secret_holding_a_key_and_the_plugin_references_no_secret(helm):
    serving, plugin_ca = "gpustack-models-api-serving", "gpustack-models-plugin-ca"
    operator = {"operator-serving", "operator-ca"}
    expected = {  # the values: the Secrets holding keys, and those of them the operator made (not rendered)
        (): ({serving, plugin_ca}, set()),
        CERT_MANAGER: ({serving, plugin_ca, "gpustack-models-api-ca"}, set()),
        EXISTING: (operator, operator),
        CERT_MANAGER + EXISTING: (operator, operator),
        EXISTING_SERVING: ({"operator-serving", plugin_ca}, {"operator-serving"}),
        CERT_MANAGER + EXISTING_PLUGIN_CA: ({serving, "gpustack-models-api-ca", "operator-ca"}, {"operator-ca"}),
    }
    for values, (keys, made_by_the_operator) in expected.items():
        objects = render(helm, *values, "--set-json", 'imagePullSecrets=[{"name": "registry"}]')
        assert key_bearing(objects) | made_by_the_operator == keys, values
        specs = pod_specs(list(objects))
        owners = {owner for owner, _ in specs}
        assert {"Deployment/gpustack-models-api", "DaemonSet/gpustack-models-plugin"} <= owners, owners
        assert {"Deployment/gpustack-models-console", "Job/gpustack-models-migrate-1"} <= owners, owners
        reading = {owner: referenced_secrets(spec) & keys for owner, spec in specs}
        # The API signs the plugins' certificates and serves TLS: it references both keys, and only it does.
        # (cert-manager's API CA Secret backs its Issuer only.)
        assert reading.pop("Deployment/gpustack-models-api") == keys - {"gpustack-models-api-ca"}, values
        assert {owner: names for owner, names in reading.items() if names} == {}, values
        (plugin,) = [spec for owner, spec in specs if owner == "DaemonSet/gpustack-models-plugin"]
        assert referenced_secrets(plugin) == set(), values
        assert plugin["imagePullSecrets"] == [{"name": "registry"}]


def test_the_api_prefers_nodes_without_a_plugin_by_default(helm):
    objects = render(helm)
    api = one(objects, "Deployment", "gpustack-models-api")["spec"]["template"]["spec"]
    (term,) = api["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    plugin_labels = one(objects, "DaemonSet", "gpustack-models-plugin")["spec"]["template"]["metadata"]["labels"]
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= plugin_labels.items() and "app.kubernetes.io/name" in selector
    # A rule added in api.affinity (helm merges it with the preference).
    term = {"matchExpressions": [{"key": "node-role.example/control", "operator": "Exists"}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    values = ("--set-json", f"api.affinity={json.dumps({'nodeAffinity': required})}")
    merged = one(render(helm, *values), "Deployment", "gpustack-models-api")["spec"]["template"]["spec"]
    assert merged["affinity"] == {"nodeAffinity": required, "podAntiAffinity": api["affinity"]["podAntiAffinity"]}


def test_the_nodes_get_the_ca_certificates_from_a_configmap_without_a_key(helm):
    objects = render(helm)
    ca = one(objects, "ConfigMap", "gpustack-models-ca")["data"]
    assert set(ca) == {"api-ca.crt", "plugin-ca.crt"}
    assert not any("PRIVATE KEY" in pem for pem in ca.values())
    serving, plugin_ca = (
        one(objects, "Secret", n)["data"] for n in ("gpustack-models-api-serving", "gpustack-models-plugin-ca")
    )
    assert ca["api-ca.crt"] == base64.b64decode(serving["ca.crt"]).decode()
    assert ca["plugin-ca.crt"] == base64.b64decode(plugin_ca["tls.crt"]).decode()
    plugin = one(objects, "DaemonSet", "gpustack-models-plugin")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in plugin["containers"]}
    assert all(any(m["name"] == "ca" for m in c.get("volumeMounts", [])) for c in containers.values())
    mounter = {e["name"]: e.get("value") for e in containers["mounter"]["env"]}
    assert mounter["GPUSTACK_API_CA_FILE"] == "/etc/gpustack-models/ca/api-ca.crt"
    env = {e["name"]: e.get("value") for e in containers["plugin"]["env"]}
    assert env["GPUSTACK_API_CA_FILE"] == "/etc/gpustack-models/ca/api-ca.crt"
    assert (
        env["GPUSTACK_PLUGIN_CA_FILE"] == env["GPUSTACK_PLUGIN_PEER_CA_FILE"] == "/etc/gpustack-models/ca/plugin-ca.crt"
    )
    # No bearer token for the peers: they present client certificates the API issues.
    assert "GPUSTACK_PLUGIN_PEER_TOKEN_FILE" not in env
    assert not [v for v in plugin["volumes"] if "projected" in v]
    (volume,) = [v for v in plugin["volumes"] if v["name"] == "ca"]
    assert volume == {"name": "ca", "configMap": {"name": "gpustack-models-ca"}}


def test_with_cert_manager_the_api_publishes_the_ca_configmap_and_may_write_that_one_only(helm):
    objects = render(helm, *CERT_MANAGER)
    assert not [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpustack-models-ca"]
    (api,) = one(objects, "Deployment", "gpustack-models-api")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in api["env"]}
    assert env["GPUSTACK_CA_CONFIGMAP"] == "gpustack-models-ca"
    mounts = {m["mountPath"]: m["name"] for m in api["volumeMounts"]}
    serving_file = env["GPUSTACK_API_SERVING_CA_FILE"]
    assert serving_file == "/etc/gpustack-models/serving/ca.crt" and mounts["/etc/gpustack-models/serving"] == "serving"
    role = one(objects, "Role", "gpustack-models-worker:ca-publisher")
    assert role["metadata"]["namespace"] == NS
    one_configmap = {"resourceNames": ["gpustack-models-ca"], "verbs": ["get", "update", "patch"]}
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], **one_configmap},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
    ]
    binding = one(objects, "RoleBinding", "gpustack-models-worker:ca-publisher")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpustack-models-worker", "namespace": NS}]
    # Prometheus too reads the CAs from the ConfigMap, never from a Secret holding a key.
    monitor = one(objects, "ServiceMonitor", "gpustack-models")
    cas = [e["tlsConfig"]["ca"] for e in monitor["spec"]["endpoints"] if "tlsConfig" in e]
    assert cas == [
        {"configMap": {"name": "gpustack-models-ca", "key": "api-ca.crt"}},
        {"configMap": {"name": "gpustack-models-ca", "key": "plugin-ca.crt"}},
    ]


def test_the_console_has_a_serviceaccount_of_its_own_and_no_token(helm):
    objects = render(helm)
    account = one(objects, "ServiceAccount", "gpustack-models-console")
    assert account["automountServiceAccountToken"] is False
    spec = one(objects, "Deployment", "gpustack-models-console")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpustack-models-console"
    assert spec["automountServiceAccountToken"] is False
    others = [
        owner for owner, s in pod_specs(list(objects)) if s.get("serviceAccountName") == "gpustack-models-console"
    ]
    assert others == ["Deployment/gpustack-models-console"]


def ingress_by_port(policy: dict) -> dict[int, list]:
    """The peers each port of a NetworkPolicy admits (a rule with no ``from``: everyone, as ``None``)."""
    admitted: dict[int, list] = {}
    for rule in policy["spec"].get("ingress") or []:
        for port in rule["ports"]:
            peers = rule.get("from")
            admitted[port["port"]] = None if peers is None else admitted.get(port["port"], []) + peers
    return admitted


def selects(policy: dict, deployment: dict) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]
    matched = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In"
        matched = matched and labels.get(expression["key"]) in expression["values"]
    return matched


def test_the_console_and_the_metrics_ports_admit_only_the_peers_the_values_name(helm):
    names = ["gpustack-models-api", "gpustack-models-worker"]
    service = [{"podSelector": {"matchExpressions": [
        {"key": "app.kubernetes.io/name", "operator": "In", "values": names},
        {"key": "app.kubernetes.io/instance", "operator": "In", "values": ["models"]},
    ]}}]  # fmt: skip
    for values, scrapers, staff in (((), [], []), (PEERS, [SCRAPER], [STAFF])):
        objects = render(helm, *values)
        policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
        console, background = policies["gpustack-models-console"], policies["gpustack-models-background"]
        assert console["spec"]["policyTypes"] == background["spec"]["policyTypes"] == ["Ingress"]
        assert selects(console, one(objects, "Deployment", "gpustack-models-console"))
        for role in ("informers", "worker", "beat"):
            assert selects(background, one(objects, "Deployment", f"gpustack-models-{role}")), role
        # Nothing in the cluster by default (an empty list of rules admits nothing).
        assert ingress_by_port(console) == ({8000: staff} if staff else {}), values
        assert ingress_by_port(background) == ({9100: scrapers} if scrapers else {}), values
        plugin = ingress_by_port(policies["gpustack-models-plugin"])
        assert plugin[9443] == service + scrapers, values  # its HTTPS port serves /metrics
        # The API's port is open (kube-apiserver reaches it from outside the Pod network; it authenticates).
        everyone = {name for name, p in policies.items() if None in ingress_by_port(p).values()}
        assert everyone == {"gpustack-models-api"}, values
