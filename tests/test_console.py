"""The admin console, in a real headless browser, shows the mirror: the dashboard, tenants, nodes, artifacts,
prefetches; its numbers refresh in place; it offers no write; its pages cost a fixed number of queries."""

import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest
import requests

from gpustack_models.kinds import GROUP
from tests.support import REPO, TEST_STATE, kube_update, wait_for
from tests.support.console import running_console
from tests.support.stores import STORAGE, entry, prefetch, put_entries, store

SCREENSHOTS = TEST_STATE / "screenshots"
TIB = 2**40

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
    with running_console(env) as url:
        yield url, password


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

        def counts(node):
            page.goto(f"{url}/admin/nodes/?q={node}")
            row = page.locator(f"#node-list tr#node-{node}")
            return {c: row.locator(f"td.{c}").inner_text() for c in ("entries", "ready", "downloading", "failed")}

        assert wait_for(lambda: counts(a) == {"entries": "1", "ready": "0", "downloading": "1", "failed": "0"}, 30)
        assert wait_for(lambda: counts(b) == {"entries": "1", "ready": "1", "downloading": "0", "failed": "0"}, 30)
        prefetches = rows("prefetch", "warm-console")
        assert artifact in prefetches
        # A node store's page, from the nodes' list, lists its entries with their progress.
        page.goto(f"{url}/admin/nodes/?q={a}")
        page.click(f"#node-list >> text={a}")
        assert page.url == f"{url}/admin/nodes/{a}/"
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
    """The node stores' and the nodes' lists cost the same number of queries for 3 rows as for 40."""
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
    few, _ = queries("/admin/nodes/")
    few_nodes, _ = queries("/admin/gpustack_models/node/")
    add(3, 37)
    many, page = queries("/admin/nodes/")
    many_nodes, nodes_page = queries("/admin/gpustack_models/node/")
    assert (many, many_nodes) == (few, few_nodes)
    assert page.count('<td class="entries">4</td>') == 40
    assert page.count('<td class="ready state-ready">2</td>') == 40
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


def _login(page, url, password, username="admin"):
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")


def _put_status(worker_kube, node, entries, total=TIB, stored=TIB // 4):
    """The store's status as the node's plugin writes it: its entries and the cache's capacity."""
    capacity = {"totalBytes": total, "storedBytes": stored, "usedPercent": int(stored * 100 / total)}
    return kube_update(
        worker_kube,
        f"{STORAGE}/nodemodelstores/{node}/status",
        lambda obj: dict(obj, status={"models": entries, "capacity": capacity}),
    )


def _offers_no_write(page):
    """No form posts but logout's; no add, change or delete link or button."""
    # Both counts in one evaluation: the live refresh may swap the page's parts between two queries.
    posting, logout = page.evaluate(
        "[document.querySelectorAll('form[method=post]').length, document.querySelectorAll('form#logout-form').length]"
    )
    assert posting == logout
    assert page.locator("a[href$='/add/'], a[href$='/delete/'], a.addlink, a.changelink, a.deletelink").count() == 0
    assert page.locator("input[name=_save], select[name=action]").count() == 0


def _changelist(page, url, model, verbose, query=""):
    """The text of each row of ``model``'s list page (searched for ``query``), once its heading is checked
    and no write is offered: an error page or a redirect to the login page fails here."""
    page.goto(f"{url}/admin/gpustack_models/{model}/" + (f"?q={query}" if query else ""))
    assert page.url.split("?")[0] == f"{url}/admin/gpustack_models/{model}/", page.url
    assert page.title() == f"Select {verbose} to view | GPUStack models"
    assert page.locator("#content h1").all_inner_texts() == [f"Select {verbose} to view"]
    _offers_no_write(page)
    return page.locator("#result_list tbody tr").all_inner_texts()


def _db(query):
    """``query``'s answer, read in a thread of its own (the browser's driver runs an event loop in this one)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def run():
        try:
            return query()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _shot(page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_its_pages_show_the_cluster_live_and_offer_no_write(
    console, nodes, resolved, worker_kube, namespace, mirror_db
):
    from playwright.sync_api import sync_playwright

    from gpustack_models.console import queries
    from gpustack_models.informers.mirror import KINDS
    from gpustack_models.kinds.formatting import capacity_text
    from gpustack_models.models import InformerState, NodeStore, PluginPod

    url, password = console
    artifact, digest = resolved
    a, b, c = nodes
    made = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{artifact}")
    repository = made["spec"]["source"]["huggingFace"]["repository"]
    files = made["status"]["resolved"]["fileCount"]
    for name in nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    prefetch(worker_kube, namespace, "warm-live", artifact, [a, b])
    _put_status(worker_kube, a, [entry(digest, "Downloading", 0)])
    _put_status(worker_kube, b, [entry(digest, "Failed", 0, reason="SourceUnavailable")])
    _put_status(worker_kube, c, [])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        _login(page, url, password)
        page.wait_for_url(f"{url}/admin/")

        # The dashboard: the nodes running the plugin and the cluster's cache capacity.
        def dashboard():
            page.goto(f"{url}/admin/")
            plugins = _db(lambda: PluginPod.objects.live().exclude(node="").values("node").distinct().count())
            total = _db(lambda: sum(NodeStore.objects.live().values_list("total_bytes", flat=True)))
            shown = page.inner_text("#node-count")
            summed = _db(queries.cluster_capacity)  # the stores' one figure, summed
            figure = capacity_text(summed["total_bytes"], summed["stored_bytes"], summed["used_percent"])
            shown_figure = page.inner_text("#capacity")
            return shown == str(plugins) and total >= 3 * TIB and shown_figure.startswith(figure) and shown

        assert int(wait_for(dashboard, timeout=30, interval=1, message="the dashboard's nodes and capacity")) >= 3
        assert page.locator("#tile-capacity .bar .fill").count() == 1
        assert "SourceUnavailable" in page.inner_text("#failures")
        _offers_no_write(page)
        _shot(page, "dashboard")

        # The tenants, then the tenant's page: the artifact's bar moves without the page reloading.
        page.goto(f"{url}/admin/tenants/?q={namespace}")
        assert namespace in page.inner_text("#tenant-list")
        _offers_no_write(page)
        _shot(page, "tenants")
        row = f"#artifact-{artifact}"

        def cell(selector):
            return page.inner_text(f"{row} {selector}")

        def at_zero():
            page.goto(f"{url}/admin/tenants/{namespace}/")
            return cell(".downloading") == "1" and cell(".percent") == "0%"

        wait_for(at_zero, timeout=30, interval=1, message="the tenant's artifact at 0 %")
        assert cell(".failed") == "1" and "SourceUnavailable" in cell(".reasons")
        _offers_no_write(page)
        loaded = page.evaluate("window.probe = 'kept'; window.consoleLoadedAt")
        _put_status(worker_kube, a, [entry(digest, "Downloading", 420)])
        wait_for(lambda: cell(".percent") == "42%", timeout=30, interval=0.5, message="the bar at 42 %")
        assert page.get_attribute(f"{row} .bar", "aria-valuenow") == "42"
        _shot(page, "tenant")
        _put_status(worker_kube, a, [entry(digest, "Ready", 1000)])
        _put_status(worker_kube, b, [])
        wait_for(lambda: cell(".percent") == "Ready", timeout=30, interval=0.5, message="the artifact Ready")
        assert page.get_attribute(f"{row} .bar", "aria-valuenow") == "100"
        assert page.evaluate("[window.probe, window.consoleLoadedAt]") == ["kept", loaded]
        assert page.evaluate("window.consoleRefreshes") >= 2

        # A node's page after a failure: the capacity bar with its watermarks, the reason, the retry time.
        _put_status(worker_kube, c, [entry(digest, "Failed", 10, reason="IntegrityMismatch")])
        failed = NodeStore.objects.filter(name=c, entries__reason="IntegrityMismatch")
        pk = wait_for(lambda: _db(lambda: failed.values_list("pk", flat=True).first()), message="the failure mirrored")
        page.goto(f"{url}/admin/gpustack_models/nodestore/{pk}/change/")  # the row number's URL: to the name's
        assert page.url == f"{url}/admin/nodes/{c}/"
        assert page.locator("#capacity-bar .mark.high").count() == 1
        assert page.locator("#capacity-bar .mark.low").count() == 1
        assert "25% of 1.0Ti used (the model cache holds 256.0Gi)" in page.inner_text("#capacity")
        entries = page.inner_text("#entry-list")
        assert "IntegrityMismatch" in entries and "2030-01-01T00:00:00Z (in " in entries
        assert f"{namespace}/{artifact}" in entries
        assert "not placed on this node" in entries  # c was never given it: shown, and counted nowhere
        _offers_no_write(page)
        _shot(page, "node")

        # The artifact's page: its source, files, prefetches, nodes, conditions and kubectl commands.
        page.click(f"text={namespace}/{artifact}")
        assert page.url == f"{url}/admin/artifacts/{namespace}/{artifact}/"
        body = page.inner_text("#content-main")
        assert digest in body and "config.json" in body and "model.safetensors" in body and "warm-live" in body
        assert f"kubectl get mart {artifact} -n {namespace} --subresource=progress" in body
        assert "Resolved" in page.inner_text("#conditions") and "Z (" in page.inner_text("#conditions")
        _offers_no_write(page)
        _shot(page, "artifact")
        # Every list page shows what this test made (and what the informers hold), and offers no write.
        (row,) = _changelist(page, url, "artifact", "artifact", namespace)
        assert row.split("\t")[:4] == [artifact, namespace, f"huggingFace:{repository}", "Resolved"], row
        # The node stores' counts (entries, ready, downloading, failed) as the test wrote them: a Ready, c Failed.
        for node, counts in ((a, ["1", "1", "0", "0"]), (b, ["0", "0", "0", "0"]), (c, ["1", "0", "0", "1"])):
            page.goto(f"{url}/admin/gpustack_models/nodestore/?q={node}")  # the stock list: the console's
            assert page.url == f"{url}/admin/nodes/?q={node}" and page.title() == "Nodes | GPUStack models"
            _offers_no_write(page)
            (row,) = page.locator("#node-list tbody tr").all_inner_texts()
            cells = row.split("\t")
            assert cells[:2] == [node, "25% of 1.0Ti used (the model cache holds 256.0Gi)"], row
            assert cells[2:6] == counts and cells[6].endswith(" ago)"), row
            (row,) = _changelist(page, url, "node", "node", node)
            assert row.split("\t")[0] == node and row.split("\t")[1].endswith(" (ready)"), row
        (row,) = _changelist(page, url, "prefetch", "prefetch", namespace)
        assert row.split("\t")[:3] == ["warm-live", namespace, artifact], row
        (row,) = _changelist(page, url, "manifest", "manifest", digest)
        assert row.split("\t")[:2] == [digest, str(files)], row
        resources = _db(lambda: sorted(InformerState.objects.values_list("resource", flat=True)))
        assert set(KINDS) <= set(resources)
        rows = _changelist(page, url, "informerstate", "informer state")
        assert sorted(r.split("\t")[0] for r in rows) == resources, rows
        page.goto(f"{url}/admin/gpustack_models/prefetch/?q=warm-live")
        page.click("#result_list a >> text=warm-live")
        _offers_no_write(page)
        browser.close()


RECORD_PERCENT = """(selector) => {
    window.probe = "kept";
    window.seen = [];
    setInterval(() => {
        const el = document.querySelector(selector);
        const text = el ? el.innerText.trim() : "";
        if (text && window.seen[window.seen.length - 1] !== text) window.seen.push(text);
    }, 100);
    return window.consoleLoadedAt;
}"""


def _percents(seen):
    return [int(t[:-1]) for t in seen if t.endswith("%")]


def test_it_shows_a_real_download_move_and_a_real_failure(
    console, worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin, mirror_db
):
    """Real plugins download from the hub: the tenant page's bar moves and turns Ready without a reload, the
    dashboard shows the download's rate, and a node's page shows a real failure's reason and retry time."""
    from playwright.sync_api import sync_playwright

    from gpustack_models.models import NodeStore
    from tests.test_plugins import MiB, Scenario, big_files

    url, password = console
    moving = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    broken = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    moving.artifact(files=big_files(moving.repo, mb=8))
    broken.artifact(name="broken")
    (downloader,) = moving.plugins(1, GPUSTACK_PLUGIN_PROGRESS_INTERVAL=1)
    (failing,) = broken.plugins(1, GPUSTACK_PLUGIN_RETRY_BASE=3600)
    # The dashboard's rate is read while the hub sends 500 KB/s (the throttle is lifted once it is seen); the
    # bar's values while the download is held at 3 MiB, then at 6 MiB of its 8.
    throttle = hub.faults.throttle(moving.weights, 500_000)
    early = hub.faults.pause(moving.weights, after_bytes=3 * MiB)
    later = hub.faults.pause(moving.weights, after_bytes=6 * MiB)
    hub.faults.corrupt(broken.weights, times=None)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            _login(page, url, password)
            page.wait_for_url(f"{url}/admin/")
            row = "#artifact-art"

            def listed():
                page.goto(f"{url}/admin/tenants/{namespace}/")
                return page.locator(f"{row} .percent").count() == 1

            wait_for(listed, timeout=30, interval=1, message="the artifact on the tenant's page")
            loaded = page.evaluate(RECORD_PERCENT, f"{row} .percent")
            board = context.new_page()
            board.goto(f"{url}/admin/")
            moving.prefetch([downloader])

            # The dashboard: the download in flight and a rate above zero, measured between refreshes.
            def rate():
                value = int(board.get_attribute("#download-rate", "data-rate") or 0)
                return value > 0 and board.inner_text("#download-rate").endswith("/s") and value

            shown = wait_for(rate, timeout=30, interval=0.5, message="a download rate on the dashboard")
            assert shown <= 600_000  # no faster than the hub sends (bytes are reported a chunk at a time)
            assert "Downloads in flight" in board.inner_text("#tile-downloads")
            _shot(board, "dashboard-download")
            throttle.release()

            # The tenant's page: the bar moves from 0 toward 100 %, then Ready, without the page reloading.
            def between():
                return [v for v in _percents(page.evaluate("window.seen")) if 0 < v < 100]

            early.wait_held(timeout=60)
            shown_first = max(wait_for(between, timeout=30, interval=0.5, message="the bar between 0 and 100 %"))
            early.release()
            later.wait_held(timeout=30)
            wait_for(
                lambda: max(between()) > shown_first, timeout=30, interval=0.5, message="the bar at a second value"
            )
            _shot(page, "tenant-download")
            later.release()
            wait_for(
                lambda: page.evaluate("window.seen.slice(-1)[0]") == "Ready", timeout=60, interval=0.5, message="Ready"
            )
            seen = page.evaluate("window.seen")
            assert seen[0] in ("not on any node", "0%"), seen
            percents = _percents(seen)
            assert percents == sorted(percents), seen
            assert page.get_attribute(f"{row} .bar", "aria-valuenow") == "100"
            assert page.evaluate("[window.probe, window.consoleLoadedAt]") == ["kept", loaded]
            _shot(page, "tenant-ready")

            # The failing node's page: its capacity bar, the failure's reason and its retry time, an hour away.
            before = time.time()
            broken.prefetch([failing], name="warm-broken", artifact="broken")  # after: its bytes stay out of the rate
            failed = broken.wait_state(failing.node, "Failed", reason="IntegrityMismatch")
            after = time.time()
            retry = datetime.fromisoformat(failed["retryTime"].replace("Z", "+00:00"))
            # The retry base of an hour (also the backoff's cap) after the failure, to the second.
            assert int(before) + 3600 <= retry.timestamp() <= after + 3600, (before, failed["retryTime"], after)
            mirrored = NodeStore.objects.filter(name=failing.node, entries__reason="IntegrityMismatch")
            wait_for(lambda: _db(mirrored.exists), message="mirrored")
            page.goto(f"{url}/admin/nodes/{failing.node}/")
            assert page.locator("#capacity-bar .fill").count() == 1
            assert page.locator("#capacity-bar .mark.high").count() == 1
            assert " used (the model cache holds " in page.inner_text("#capacity-text")
            failure = page.locator("#entry-list tr.entry", has_text="IntegrityMismatch")
            assert "Failed" in failure.inner_text() and f"{namespace}/broken" in failure.inner_text()
            assert failure.locator("td.retry").inner_text().startswith(retry.strftime("%Y-%m-%dT%H:%M:%SZ (in "))
            _offers_no_write(page)
            _shot(page, "node-failure")
            board.goto(f"{url}/admin/")
            assert "IntegrityMismatch" in board.inner_text("#failures")
            browser.close()
    finally:
        hub.faults.clear()


CONSOLE_PAGES = (
    "/admin/", "/admin/tenants/", "/admin/tenants/ns-000/", "/admin/nodes/", "/admin/nodes/node-000/",
    "/admin/artifacts/ns-000/art/",
)  # fmt: skip


def _mirror(first, count):
    """``count`` namespaces, each with an artifact resolved to its own digest, on ``count`` nodes."""
    from gpustack_models.models import Artifact, Holding, Manifest, NodeStore, PluginPod, Prefetch, StoreEntry

    for i in range(first, first + count):
        digest = f"sha256:{i:064d}"
        files = [{"path": f"f{j}", "size": 10} for j in range(3)]
        Manifest.objects.create(digest=digest, files=files, file_count=3, size_bytes=30)
        Artifact.objects.create(
            namespace=f"ns-{i:03d}",
            name="art",
            resource_version=1,
            digest=digest,
            size_bytes=30,
            resolved_status="True",
        )
        Artifact.objects.create(namespace="ns-000", name=f"a{i:03d}", resource_version=1, digest=digest)
        Prefetch.objects.create(namespace="ns-000", name=f"p{i:03d}", artifact_name="art", resource_version=1)
        node = f"node-{i:03d}"
        store_row = NodeStore.objects.create(name=node, resource_version=1, total_bytes=100, stored_bytes=30)
        PluginPod.objects.create(namespace="sys", name=node, node=node, ready=i % 2 == 0, resource_version=1)
        for j, state in enumerate(("Ready", "Downloading", "Failed")):
            held = f"sha256:{(first + j) % (first + count):064d}"
            Holding.objects.get_or_create(node=node, digest=held)  # placed there: counted in the tenants' numbers
            StoreEntry.objects.create(
                store=store_row, node=node, digest=held, state=state,
                size_bytes=30, downloaded_bytes=10, reason="AccessDenied" if state == "Failed" else "",
            )  # fmt: skip


@pytest.mark.django_db
def test_its_pages_cost_a_fixed_number_of_queries(admin_client):
    """Each console page costs the same number of queries with 3 tenants and nodes as with 60."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def costs():
        out = {}
        for page in CONSOLE_PAGES:
            with CaptureQueriesContext(connection) as captured:
                response = admin_client.get(page)
            assert response.status_code == 200, page
            out[page] = len(captured)
        return out, response

    _mirror(0, 3)
    costs()  # the first visits fill per-process caches (content types)
    few, _ = costs()
    _mirror(3, 57)
    many, response = costs()
    assert many == few
    assert max(few.values()) <= 12
    tenants = admin_client.get("/admin/tenants/?o=-artifacts").content.decode()
    assert tenants.index("ns-000") < tenants.index("ns-001") and "page 1 of 2" in tenants


@pytest.mark.django_db
def test_it_refuses_a_user_without_staff_status(client, django_user_model):
    user = django_user_model.objects.create_user("tenant", password="secret-enough")
    client.force_login(user)
    for page in ("/admin/", "/admin/tenants/", "/admin/tenants/ns/", "/admin/gpustack_models/nodestore/"):
        response = client.get(page)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], page


@pytest.mark.django_db
def test_it_manages_no_accounts(admin_client):
    """Accounts are made with manage.py; the console has no page to add or change one."""
    for page in ("/admin/auth/user/", "/admin/auth/user/add/", "/admin/auth/group/"):
        assert admin_client.get(page).status_code == 404, page


@pytest.mark.django_db
def test_it_serves_its_icon_where_browsers_ask_for_one(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert '<link rel="icon" href="/static/console/favicon.svg" type="image/svg+xml">' in page
    moved = admin_client.get("/favicon.ico")  # asked for whatever the page links: no 404 in the browser's log
    assert moved.status_code == 301 and moved["Location"] == "/static/console/favicon.svg"
    icon = admin_client.get(moved["Location"])
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)


LAPSED = "0 of 1 nodes ready, 1 lapsed: change the prefetch's spec (its retention, for example) to place it again"


def _named_rows():
    """A node with 8 % of its 252 GiB volume used, its cache holding 24 MiB: one artifact Ready there (its
    content shared with another namespace's artifact), one downloading, one failed; a prefetch lapsed."""
    from datetime import UTC

    from gpustack_models.models import Artifact, Holding, Manifest, NodeStore, Prefetch, StoreEntry

    gib, mib = 2**30, 2**20
    node = NodeStore.objects.create(
        name="node-x", resource_version=1, total_bytes=252 * gib, stored_bytes=24 * mib, used_percent=8
    )
    NodeStore.objects.create(name="node-y", resource_version=1)  # no report yet, no failure
    ready, moving, broken = (f"sha256:{c * 64}" for c in "abc")
    resolved = {
        "type": "Resolved",
        "status": "True",
        "reason": "Resolved",
        "lastTransitionTime": "2026-12-04T21:48:50Z",
    }
    body = {"status": {"conditions": [resolved]}}
    for namespace, name, digest in (
        ("tenant-a", "llama", ready),
        ("tenant-b", "copy", ready),
        ("tenant-a", "dl", moving),
    ):
        Artifact.objects.create(
            namespace=namespace, name=name, resource_version=1, digest=digest, size_bytes=16 * mib,
            resolved_status="True", body=body,
        )  # fmt: skip
    Manifest.objects.create(digest=ready, files=[], file_count=0, size_bytes=16 * mib)
    retry = datetime(2030, 1, 1, tzinfo=UTC)
    for digest, state, done, reason in ((ready, "Ready", 961, ""), (moving, "Downloading", 10 * mib, ""),
                                        (broken, "Failed", 0, "AccessDenied")):  # fmt: skip
        Holding.objects.create(node="node-x", digest=digest)
        StoreEntry.objects.create(
            store=node, node="node-x", digest=digest, state=state, size_bytes=961 if state == "Ready" else 16 * mib,
            downloaded_bytes=done, reason=reason, retry_time=retry if reason else None,
        )  # fmt: skip
    lapse = {"type": "Available", "status": "False", "reason": "Lapsed", "message": LAPSED}
    status = {"desiredNodes": 1, "readyNodes": 0, "lapsedNodes": 1, "conditions": [lapse]}
    Prefetch.objects.create(namespace="tenant-a", name="warm", artifact_name="llama", resource_version=1, status=status)
    return node


@pytest.mark.django_db
def test_it_links_by_name_and_prints_one_capacity_figure_one_size_and_one_time(admin_client):
    """An artifact's page and a node's are linked by name (the row numbers' URLs redirect there); the node
    stores' list replaces the stock one; the capacity figure, sizes and times print one way everywhere; the
    tenant's page says what its bytes are, that ready counts shared copies, and which prefetches lapsed."""
    from html import unescape

    from gpustack_models.kinds.formatting import timestamp
    from gpustack_models.models import Artifact, Manifest

    node = _named_rows()
    figure = "8% of 252.0Gi used (the model cache holds 24.0Mi)"

    def page(path):
        response = admin_client.get(path)
        assert response.status_code == 200, path
        return unescape(response.content.decode())

    llama = Artifact.objects.get(namespace="tenant-a", name="llama")
    moved = admin_client.get(f"/admin/gpustack_models/artifact/{llama.pk}/change/")
    assert (moved.status_code, moved["Location"]) == (301, "/admin/artifacts/tenant-a/llama/")
    assert admin_client.get("/admin/artifacts/tenant-a/nothing/").status_code == 404
    artifact = page("/admin/artifacts/tenant-a/llama/")
    assert llama.digest in artifact and '<a href="/admin/nodes/node-x/">node-x</a>' in artifact
    assert "2026-12-04T21:48:50Z (" in artifact and " ago)" in artifact  # the condition's time
    assert "copies placed there for another namespace" in artifact
    assert '<td class="lapsed">1</td>' in artifact and f"Lapsed</span>: {LAPSED}" in artifact

    moved = admin_client.get(f"/admin/gpustack_models/nodestore/{node.pk}/change/")
    assert (moved.status_code, moved["Location"]) == (301, "/admin/nodes/node-x/")
    store = page("/admin/nodes/node-x/")
    assert f"{figure}; downloads stop" in store and "961B" in store and "2030-01-01T00:00:00Z (in " in store
    assert '<a href="/admin/artifacts/tenant-a/llama/">tenant-a/llama</a>' in store

    stock = admin_client.get("/admin/gpustack_models/nodestore/?failed=AccessDenied")
    assert stock["Location"] == "/admin/nodes/?failed=AccessDenied"
    nodes = page(stock["Location"])
    assert "node-x" in nodes and "node-y" not in nodes  # only the stores with such a failure
    assert f'<td class="capacity">{figure}</td><td class="entries">3</td>' in nodes
    assert f'<td class="updated">{timestamp(node.updated_at)} (' in nodes
    assert "no capacity reported yet" in page("/admin/nodes/?q=node-y")
    assert f"{figure} across" in page("/admin/")  # one store: the dashboard's sum is its figure

    tenant = page("/admin/tenants/tenant-a/")
    assert '<a href="/admin/artifacts/tenant-a/llama/">llama</a>' in tenant
    assert "16.0Mi on each ready node" in tenant and "10.0Mi downloaded so far" in tenant
    assert "copies placed there for another namespace" in tenant
    assert f"warm</span>: 1 node lapsed (Lapsed: {LAPSED})" in tenant

    assert '<a href="/admin/artifacts/tenant-b/copy/">copy</a>' in page("/admin/gpustack_models/artifact/")
    prefetches = page("/admin/gpustack_models/prefetch/")
    assert '<td class="field-lapsed">1</td>' in prefetches and f"False (Lapsed): {LAPSED}" in prefetches
    created = Manifest.objects.get().created_at
    assert f'<td class="field-created_at nowrap">{timestamp(created)}</td>' in page("/admin/gpustack_models/manifest/")


@pytest.mark.django_db
def test_it_names_registry_and_s3_sources_as_kubectl_does(admin_client):
    """Artifacts of an OCI registry and of an S3 prefix, mirrored as the informers mirror them: the tenant's
    page and the artifact's page name the source (the reference; the bucket and prefix)."""
    from html import unescape

    from gpustack_models.informers import mirror

    sources = {
        "packed": {"oci": {"reference": "registry.example/models/qwen:v1", "secretRef": {"name": "pull"}}},
        "stored": {"s3": {"endpoint": "http://minio:9000", "bucket": "models", "prefix": "qwen/0.5b"}},
    }
    for rv, (name, source) in enumerate(sources.items(), start=1):
        meta = {
            "namespace": "tenant-s",
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "generation": 1,
        }
        body = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelArtifact", "metadata": meta}
        mirror.apply_object(mirror.ARTIFACTS, dict(body, spec={"source": source}))
    tenant = unescape(admin_client.get("/admin/tenants/tenant-s/").content.decode())
    assert "oci:registry.example/models/qwen:v1" in tenant and "s3:models/qwen/0.5b" in tenant
    packed = unescape(admin_client.get("/admin/artifacts/tenant-s/packed/").content.decode())
    assert "oci: registry.example/models/qwen:v1" in packed
    stored = unescape(admin_client.get("/admin/artifacts/tenant-s/stored/").content.decode())
    assert "s3: models/qwen/0.5b" in stored
