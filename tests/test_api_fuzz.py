"""Hostile input, generated: schemathesis against the OpenAPI document the API serves, every operation, valid
and invalid data, through kube-apiserver as an administrator and as a tenant. No answer may be a 5xx, and
every 4xx must be a Kubernetes ``Status``.

``make test`` runs a small budget of examples per operation; ``make fuzz`` a large one
(``GPUSTACK_FUZZ_EXAMPLES``) and prints the figure."""

import os
from dataclasses import dataclass, field

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck
from kubernetes import client as k8s
from schemathesis import GenerationMode

from gpustack_models.kinds import GROUP
from tests.test_api_authz import bind, make_namespace

EXAMPLES = int(os.environ.get("GPUSTACK_FUZZ_EXAMPLES", "4"))


@dataclass
class Findings:
    operations: int = 0
    examples: int = 0
    server_errors: list[str] = field(default_factory=list)
    not_status: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def fuzz_namespace(worker_api, core, api_client):
    """Where generated requests land (tenant erin may do anything to the group's resources there)."""
    namespace = make_namespace(core, "fuzz")
    rules = [k8s.V1PolicyRule(api_groups=[GROUP], resources=["*"], verbs=["*"])]
    bind(api_client, namespace, "User", "erin", rules, name="fuzz-tenant")
    yield namespace
    core.delete_namespace(namespace)


@pytest.fixture(scope="module")
def served_schema(worker_api, cluster):
    """The OpenAPI document the API serves (asked of it directly, as kube-apiserver asks)."""
    cert = (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))
    session = worker_api.session(cert=cert, headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"})
    resp = session.get(f"{worker_api.url}/openapi/v2")
    assert resp.status_code == 200, resp.text[:300]
    return schemathesis.openapi.from_dict(resp.json())


def admin_session(cluster) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.cert = (str(cluster.pki_path("admin.crt")), str(cluster.pki_path("admin.key")))
    return session


def tenant_session(cluster) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.headers["Authorization"] = f"Bearer {cluster.tokens()['erin']}"
    return session


def judge(case, response, findings: Findings) -> None:
    findings.examples += 1
    where = f"{case.method} {case.formatted_path} {case.query or ''} -> {response.status_code}"
    if response.status_code >= 500:
        findings.server_errors.append(f"{where}: {response.text[:200]}")
    elif response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not (body.get("kind") == "Status" and body.get("code") == response.status_code):
            findings.not_status.append(f"{where}: {response.text[:200]}")


def fuzz_operation(operation, mode, session, base_url, namespace, findings):
    strategy = operation.as_strategy(generation_mode=mode)

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.generate],
    )
    @hypothesis.given(case=strategy)
    def run(case):
        if "namespace" in (case.path_parameters or {}) and mode is GenerationMode.POSITIVE:
            case.path_parameters["namespace"] = namespace  # valid requests land where they can do something
        if case.query and "watch" in case.query:
            case.query["timeoutSeconds"] = 1  # a watch ends instead of holding the run
        try:
            response = case.call(
                base_url=base_url, session=session, timeout=20, verify=session.verify, cert=session.cert
            )
        except requests.RequestException as exc:
            findings.server_errors.append(f"{case.method} {case.formatted_path}: {type(exc).__name__}: {exc}")
            return
        judge(case, response, findings)

    run()


@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_it_answers_generated_input_with_a_status_and_never_a_5xx(who, served_schema, fuzz_namespace, cluster):
    session = admin_session(cluster) if who == "admin" else tenant_session(cluster)
    findings = Findings()
    for result in served_schema.get_all_operations():
        operation = result.ok()
        findings.operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(operation, mode, session, cluster.server, fuzz_namespace, findings)
    print(
        f"fuzz ({who}): {findings.operations} operations, {findings.examples} examples, "
        f"{len(findings.server_errors)} 5xx, {len(findings.not_status)} 4xx without a Status"
    )
    assert findings.operations >= 15 and findings.examples >= findings.operations
    assert findings.server_errors == []
    assert findings.not_status == []
