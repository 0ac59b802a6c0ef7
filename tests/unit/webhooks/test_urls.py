"""The placement webhook's route: the path its MutatingWebhookConfiguration (and the caller's RBAC) names
resolves, in the API process, to the webhook, served on the API's pool of threads; the console routes it not."""

import inspect

import pytest
from django.urls import Resolver404, resolve

from gpustack_models.install import webhooks as install
from gpustack_models.webhooks.placement import PlacementView
from tests.unit.urlconfs import for_role


def test_the_path_kube_apiserver_is_given_is_the_webhook_in_the_api_process():
    [webhook] = install.placement_webhook()["webhooks"]
    path = webhook["clientConfig"]["service"]["path"]
    assert path == install.PATH
    assert install.caller_objects()[0]["rules"] == [{"nonResourceURLs": [path], "verbs": ["post"]}]
    match = resolve(path, urlconf=for_role("api"))
    assert match.func.view_class is PlacementView
    assert inspect.iscoroutinefunction(match.func) and match.func.csrf_exempt


def test_the_console_does_not_route_it():
    with pytest.raises(Resolver404):
        resolve(install.PATH, urlconf=for_role("console"))
