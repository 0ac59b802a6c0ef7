"""The routes the node plugins call: each path a plugin posts to resolves, in the API process, to its view,
served on the API's pool of threads; the console routes none of them."""

import inspect

import pytest
from django.urls import Resolver404, resolve

from gpustack_models.internal.certificates import PluginCertificateView
from gpustack_models.internal.mounts import MountView, ReleaseView
from gpustack_models.internal.tickets import TicketView
from gpustack_models.plugin.node import serving_cert
from tests.unit.urlconfs import for_role

# What the plugins post to: the agent's fetch tickets, the CSI driver's mounts, the serving certificates.
CALLED = [
    ("/internal/v1/tickets", TicketView),
    ("/internal/v1/mounts", MountView),
    ("/internal/v1/mounts/release", ReleaseView),
    (serving_cert.PATH, PluginCertificateView),
]


@pytest.fixture(scope="module")
def api():
    return for_role("api")


@pytest.mark.parametrize("path, view", CALLED)
def test_each_path_a_plugin_calls_is_its_view_in_the_api_process(api, path, view):
    match = resolve(path, urlconf=api)
    assert match.func.view_class is view and match.route == path.lstrip("/")
    assert inspect.iscoroutinefunction(match.func) and match.func.csrf_exempt  # on the API's threads


@pytest.mark.parametrize("path", ["/internal/v1/tickets/x", "/internal/v1/mount", "/internal/v1/plugin-certificates/"])
def test_nothing_else_under_the_plugins_prefix_resolves(api, path):
    with pytest.raises(Resolver404):
        resolve(path, urlconf=api)


@pytest.mark.parametrize("path, view", CALLED)
def test_the_console_routes_none_of_them(path, view):
    with pytest.raises(Resolver404):
        resolve(path, urlconf=for_role("console"))
