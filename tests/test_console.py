"""The admin console, in a real headless browser, shows the mirror: artifacts, node stores, prefetches."""

import subprocess
import sys
import uuid

import pytest
import requests

from gpustack_models.kinds import GROUP
from gpustack_models.local.cluster import free_port
from tests.support import REPO, TEST_STATE, wait_for
from tests.support.stores import entry, prefetch, put_entries, store

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def console(worker_stack):
    password = uuid.uuid4().hex
    env = dict(worker_stack.env(), DJANGO_SUPERUSER_PASSWORD=password, GPUSTACK_SERVER_ROLE="console")
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput", "--username=admin", "--email=admin@example.com"],
        cwd=REPO,
        env=env,
        check=False,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "manage.py", "changepassword", "admin"],
        cwd=REPO,
        env=env,
        input=f"{password}\n{password}\n",
        text=True,
        capture_output=True,
    )
    port = free_port()
    log = open(TEST_STATE / "console.log", "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--no-control-socket",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    session = requests.Session()
    session.trust_env = False
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(session, url), timeout=30, message="the console")
    yield url, password
    proc.terminate()
    proc.wait(10)


def _up(session, url):
    try:
        return session.get(f"{url}/admin/login/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_it_shows_artifacts_node_stores_and_prefetches(console, nodes, resolved, worker_kube, namespace):
    from playwright.sync_api import sync_playwright

    url, password = console
    artifact, digest = resolved
    a, b, _ = nodes
    for name in (a, b):
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    prefetch(worker_kube, namespace, "warm-console", artifact, [a, b])
    put_entries(worker_kube, a, [entry(digest, "Downloading", 420)])
    put_entries(worker_kube, b, [entry(digest, "Ready", 1000)])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(f"{url}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(f"{url}/admin/")
        assert page.inner_text("#site-name") == "GPUStack models"
        assert page.title().endswith("| GPUStack models")

        def rows(path, text):
            def look():
                page.goto(f"{url}/admin/gpustack_models/{path}/?q={text}")
                body = page.inner_text("#result_list") if page.locator("#result_list").count() else ""
                return body if text in body else None

            return wait_for(look, timeout=30, interval=1, message=f"{text} on the {path} page")

        artifacts = rows("artifact", artifact)
        assert namespace in artifacts and "Resolved" in artifacts
        stores = rows("nodestore", a)
        assert a in stores

        def counts(node):
            page.goto(f"{url}/admin/gpustack_models/nodestore/?q={node}")
            row = page.locator("#result_list tbody tr", has_text=node)
            return {c: row.locator(f"td.field-{c}").inner_text() for c in ("models", "ready", "downloading", "failed")}

        assert wait_for(lambda: counts(a) == {"models": "1", "ready": "0", "downloading": "1", "failed": "0"}, 30)
        assert wait_for(lambda: counts(b) == {"models": "1", "ready": "1", "downloading": "0", "failed": "0"}, 30)
        prefetches = rows("prefetch", "warm-console")
        assert artifact in prefetches
        # A node store's page lists its entries with their progress.
        page.goto(f"{url}/admin/gpustack_models/nodestore/?q={a}")
        page.click(f"text={a}")
        detail = wait_for(
            lambda: (t := page.inner_text("body")) and "42%" in t and t,
            timeout=30,
            interval=1,
            message="the entry's progress on the store page",
        )
        assert digest[:19] in detail
        browser.close()


@pytest.mark.django_db
def test_it_computes_list_columns_in_the_database(admin_client):
    """The node store and node lists cost the same number of queries for 3 rows as for 40."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpustack_models.models import Node, NodeStore, PluginPod, StoreEntry

    def add(first, count):
        for i in range(first, first + count):
            name = f"listed-{i:03d}"
            store = NodeStore.objects.create(name=name, resource_version=1, body={})
            for j, state in enumerate(("Ready", "Downloading", "Failed", "Ready")):
                StoreEntry.objects.create(store=store, node=name, digest=f"sha256:{j:064d}", state=state)
            Node.objects.create(name=name, resource_version=1, body={})
            PluginPod.objects.create(
                namespace="ns", name=name, node=name, pod_ip="10.0.0.1", ready=True, resource_version=1
            )

    def queries(path):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(path)
        assert response.status_code == 200
        return len(captured), response.content.decode()

    add(0, 3)
    few, _ = queries("/admin/gpustack_models/nodestore/")
    few_nodes, _ = queries("/admin/gpustack_models/node/")
    add(3, 37)
    many, page = queries("/admin/gpustack_models/nodestore/")
    many_nodes, nodes_page = queries("/admin/gpustack_models/node/")
    assert (many, many_nodes) == (few, few_nodes)
    assert page.count('<td class="field-models">4</td>') == 40
    assert page.count('<td class="field-ready">2</td>') == 40
    assert nodes_page.count("10.0.0.1 (ready)") == 40


def test_it_serves_the_console_and_nothing_of_the_api(console, worker_api):
    url, _password = console
    plain = requests.Session()
    plain.trust_env = False
    assert plain.get(f"{url}/admin/login/").status_code == 200
    assert plain.get(f"{url}/livez").status_code == 200
    # The console's plain HTTP routes neither the aggregated API nor the plugins' tickets ...
    for path in ("/apis", f"/apis/{GROUP}/v1", f"/apis/{GROUP}/v1/modelartifacts", "/openapi/v2"):
        assert plain.get(f"{url}{path}").status_code == 404, path
    assert plain.post(f"{url}/internal/v1/tickets", json={"node": "n", "digest": "d"}).status_code == 404
    # ... and the API process serves no console.
    api = worker_api.session()
    assert api.get(f"{worker_api.url}/admin/login/").status_code == 404
    assert api.get(f"{worker_api.url}/livez").status_code == 200
