"""The chart's alerts (a PrometheusRule) and Grafana dashboard against the product: both render and lint, the
rendered chart passes kube-apiserver's server-side dry run with prometheus-operator's own CRDs (pinned in
deploy/prometheus-operator), and every metric an expression names is in the scrape of each running role
that exports it, after real work: the API (HTTPS, an allowed caller), the informers, Celery worker and beat
of the suite (plain HTTP), an informers and a beat replica holding Leases of their own (the suite's run
without leader election), a node plugin that downloaded a model, and kube-apiserver (its aggregator)."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid

import pytest
import requests
import yaml

from tests.support import REPO, wait_for
from tests.support.helm import CHART, helm_test_account
from tests.support.promql import dashboard_exprs, metric_names, missing, rule_exprs, sample_names
from tests.test_chart import LOADER, NS, RELEASE, ChartCluster, kubectl, run_helm
from tests.test_leader_election import Fleet, Group, lease_name
from tests.test_plugins import Scenario
from tests.test_role_metrics import ROLES, Roles, artifact, condition_reason, scrape_api

pytestmark = pytest.mark.django_db

STORAGE = "/apis/worker.gpustack.ai/v1alpha1"
BOTH = (
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "metrics.dashboard.enabled=true",
    "--set",
    "metrics.serviceMonitor.enabled=true",
)


def render(helm: str, *values: str) -> list[dict]:
    text = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, *BOTH, *values).stdout
    return [doc for doc in yaml.load_all(text, Loader=LOADER) if doc]


def one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def dashboard(objects: list[dict]) -> dict:
    return json.loads(one(objects, "ConfigMap", "gpustack-models-dashboard")["data"]["gpustack-models.json"])


def expressions(objects: list[dict]) -> list[tuple[str, str]]:
    return rule_exprs(objects) + dashboard_exprs(dashboard(objects))


def alerts(objects: list[dict]) -> dict[str, dict]:
    rule = one(objects, "PrometheusRule", "gpustack-models")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


# --- render, lint, dry run -------------------------------------------------------------------------------
def test_lint_strict_passes_and_the_values_reach_the_rule_and_the_dashboard(helm):
    run_helm(helm, "lint", "--strict", str(CHART), *BOTH)
    assert not {o["kind"] for o in render(helm, "--set", "metrics.prometheusRule.enabled=false")} & {"PrometheusRule"}
    default = render(helm)
    rules = alerts(default)
    assert len(rules) == 10 and all(
        r["annotations"]["summary"] and r["annotations"]["description"] for r in rules.values()
    )
    assert (
        rules["GpustackModelsMirrorLagging"]["for"] == "10m" and "> 30" in rules["GpustackModelsMirrorLagging"]["expr"]
    )
    assert all(f'namespace="{NS}"' in r["expr"] for name, r in rules.items() if "APIService" not in name)
    board = one(default, "ConfigMap", "gpustack-models-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1" and board["metadata"]["namespace"] == NS
    assert dashboard(default)["uid"] == "gpustack-models" and len(expressions(default)) > 40

    tuned = render(
        helm,
        *(
            "--set",
            "metrics.prometheusRule.alerts.mirrorLag.seconds=7",
            "--set",
            "metrics.prometheusRule.alerts.mirrorLag.for=3m",
        ),
        *("--set", "metrics.prometheusRule.alerts.queueBacklog.enabled=false"),
        *(
            "--set",
            "metrics.prometheusRule.additionalLabels.release=kps",
            "--set",
            "metrics.prometheusRule.labels.team=ml",
        ),
        *("--set", "metrics.prometheusRule.runbookUrl=https://runbooks.example/models"),
        *("--set", "env.GPUSTACK_LEADER_BEAT_LEASE=other-beat"),
        *("--set", "metrics.dashboard.labels.grafana_dashboard=null", "--set", "metrics.dashboard.labels.dash=yes"),
        *(
            "--set",
            "metrics.dashboard.namespace=monitoring",
            "--set",
            "metrics.dashboard.annotations.grafana_folder=GPUStack",
        ),
    )
    rules = alerts(tuned)
    lag = rules["GpustackModelsMirrorLagging"]
    assert (
        lag["for"] == "3m"
        and lag["expr"].rstrip().endswith("> 7")
        and lag["labels"] == {"severity": "warning", "team": "ml"}
    )
    assert lag["annotations"]["runbook_url"] == "https://runbooks.example/models#gpustackmodelsmirrorlagging"
    assert "GpustackModelsQueueBacklog" not in rules and len(rules) == 9
    assert 'lease="other-beat"' in rules["GpustackModelsLeaderMissing"]["expr"]
    assert one(tuned, "PrometheusRule", "gpustack-models")["metadata"]["labels"]["release"] == "kps"
    board = one(tuned, "ConfigMap", "gpustack-models-dashboard")["metadata"]
    assert board["namespace"] == "monitoring" and board["annotations"] == {"grafana_folder": "GPUStack"}
    assert board["labels"]["dash"] == "yes" and "grafana_dashboard" not in board["labels"]
    refused = run_helm(
        helm, "template", str(CHART), *BOTH, "--set", "metrics.prometheusRule.alerts.apiErrors.for=soon", check=False
    )
    assert refused.returncode != 0 and "apiErrors" in refused.stderr and "for" in refused.stderr


@pytest.fixture(scope="module")
def chart_cluster(cluster):
    """A control plane of the chart's own, with prometheus-operator's CRDs (the suite's has the local worker's
    APIService and RBAC, which the chart would collide with)."""
    starting = ChartCluster(cluster.bin_dir)
    try:
        lc = starting.wait()
        crds = REPO / "deploy" / "prometheus-operator" / "crds.sh"
        folder = subprocess.run([str(crds)], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        for kind in ("servicemonitors", "prometheusrules"):
            kubectl(lc, "apply", "--server-side", "-f", f"{folder}/monitoring.coreos.com_{kind}.yaml")
        kubectl(lc, "apply", "--server-side", "-f", str(CHART / "crds"))
        kubectl(lc, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        kubectl(lc, "create", "namespace", NS, check=False)
        yield lc
    finally:
        starting.stop()


def test_the_rule_monitor_and_dashboard_pass_a_server_side_dry_run_and_a_bad_rule_is_refused(helm, chart_cluster):
    objects = render(helm)
    text = yaml.safe_dump_all(objects)
    # The test hook Pod's ServiceAccount must exist (a dry run makes none).
    kubectl(chart_cluster, "apply", "-f", "-", input=helm_test_account(NS, RELEASE))
    out = kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=text).stdout
    applied = [line for line in out.splitlines() if line.strip()]
    assert len(applied) == len(objects) and all("(server dry run)" in line for line in applied), out
    assert any(line.startswith("prometheusrule.monitoring.coreos.com/gpustack-models") for line in applied), out
    assert any(line.startswith("servicemonitor.monitoring.coreos.com/gpustack-models") for line in applied), out
    # A group whose alerts are all off is left out (the CRD wants rules in every group).
    off = ("downloadFailures", "cacheAboveHighWatermark")
    fewer = one(
        render(helm, *(f"--set=metrics.prometheusRule.alerts.{a}.enabled=false" for a in off)),
        "PrometheusRule",
        "gpustack-models",
    )
    assert [g["name"] for g in fewer["spec"]["groups"]] == ["gpustack-models.api", "gpustack-models.control"]
    kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(fewer))
    # The CRD's schema is checked, not merely the kind: a rule with a malformed `for` is refused, naming it.
    bad = copy.deepcopy(one(objects, "PrometheusRule", "gpustack-models"))
    bad["spec"]["groups"][0]["rules"][0]["for"] = "soon"
    refused = kubectl(chart_cluster, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0 and "spec.groups[0].rules[0].for" in refused.stderr, refused.stderr


# --- every metric named is scraped ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def elected(launcher, django_db_setup, django_db_blocker, tmp_path_factory):
    """An informers and a beat replica, each leading a Lease of its own (the suite's run without election)."""
    from tests.support.worker import database_url

    with django_db_blocker.unblock():
        url = database_url()
    fleet = Fleet(launcher, url, tmp_path_factory.mktemp("elected"))
    try:
        groups = {}
        for role in ("informers", "beat"):
            lease = lease_name()
            groups[role] = Group(lease, [fleet.start(role, lease)])
        for group in groups.values():
            group.leader()
        yield {f"{role}-elected": group.replicas[0] for role, group in groups.items()}
    finally:
        fleet.kill_all()


def _get(url: str, **kwargs) -> str:
    session = requests.Session()
    session.trust_env = False
    resp = session.get(url, timeout=10, **kwargs)
    assert resp.status_code == 200, resp.text
    return resp.text


def test_every_metric_the_alerts_and_the_dashboard_name_is_in_a_scrape_of_the_roles_exporting_it(
    helm, worker_stack, worker_api, cluster, admin_http, hub, worker_kube, namespace, start_plugin, elected
):
    exprs = expressions(render(helm))
    roles = Roles(worker_stack)
    for name in ROLES:
        wait_for(lambda n=name: _scrape_or_none(roles, n), timeout=60, message=f"the {name} metrics port")
    # Real work: a download to a node (its artifact resolved on the way), a resolution that fails.
    scenario = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    scenario.artifact()
    (plugin,) = scenario.plugins(1)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Ready", timeout=120)
    bad = f"missing-{uuid.uuid4().hex[:6]}"
    worker_kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelartifacts",
        artifact(bad, f"org/nowhere-{uuid.uuid4().hex[:6]}", "v1alpha1"),
    )
    wait_for(lambda: condition_reason(worker_kube, namespace, bad) is not None, timeout=60, message="the failure")

    def scraped() -> dict[str, set[str]]:
        texts = {name: roles.scrape(name) for name in ROLES}
        texts["api"] = scrape_api(worker_api, cluster)
        texts["plugin"] = _get(f"{plugin.url}/metrics", verify=False)
        texts["kube-apiserver"] = _get(f"{cluster.server}/metrics", verify=admin_http.verify, cert=admin_http.cert)
        texts.update({role: _get(replica.metrics_url) for role, replica in elected.items()})
        return {role: sample_names(text) for role, text in texts.items()}

    # The failure reaches the worker's counters when its task ends, a moment after the status is written.
    wait_for(lambda: "gpustack_models_resolutions_total" in scraped()["celery"], timeout=30)
    gaps = missing(exprs, scraped())
    assert gaps == [], "\n".join(f"{where}: {name} is not in the scrape of {role}" for where, name, role in gaps)
    named = set().union(*(metric_names(expr) for _, expr in exprs))
    assert {"aggregator_unavailable_apiservice", "gpustack_models_plugin_high_watermark_percent"} <= named


def _scrape_or_none(roles: Roles, name: str) -> str | None:
    try:
        return roles.scrape(name)
    except requests.RequestException:
        return None
