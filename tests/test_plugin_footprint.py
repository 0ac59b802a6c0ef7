"""The node plugin stays small enough for every GPU node: real plugin processes, one downloading from the hub
and one from its peer, serving their endpoints and reporting their stores, never import Django, the
``kubernetes`` client package, the hub clients or the service's other libraries. Python lists every import a
process makes, lazy ones included, with ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``)."""

import re

from tests.support.paths import TEST_STATE
from tests.test_plugins import Scenario, big_files

# The service's libraries: none has any use on a node.
FORBIDDEN = {"django", "rest_framework", "kubernetes", "huggingface_hub", "modelscope", "celery", "kombu"}
FORBIDDEN |= {"psycopg", "redis", "gunicorn", "whitenoise", "dj_database_url", "boto3", "botocore", "s3transfer"}
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


def log_of(node: str) -> str:
    return (TEST_STATE / f"plugin-{node}.log").read_text(errors="replace")


def imported_packages(node: str) -> set[str]:
    return {m.group(1).split(".")[0] for m in map(IMPORTED.match, log_of(node).splitlines()) if m}


def test_a_working_plugin_imports_none_of_the_services_libraries(
    worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin
):
    scenario = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    scenario.artifact(files=big_files(scenario.repo, mb=3))
    a, b = scenario.plugins(2, PYTHONPROFILEIMPORTTIME="1")
    scenario.prefetch([a])
    scenario.wait_state(a.node, "Ready", timeout=60)
    scenario.prefetch([b], name="second")
    scenario.wait_state(b.node, "Ready", timeout=60)
    assert re.search(r"ready: .* bytes by source: .*peers [1-9]", log_of(b.node))  # b's bytes came from a
    for plugin in (a, b):
        packages = imported_packages(plugin.node)
        assert {"gpustack_models", "urllib3", "grpc"} <= packages, sorted(packages)  # the list is complete
        assert not packages & FORBIDDEN, sorted(packages & FORBIDDEN)
