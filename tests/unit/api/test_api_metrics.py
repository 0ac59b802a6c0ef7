"""The API's metric labels: Kubernetes verbs and bounded resources, never names."""

import pytest
from django.test import RequestFactory

from gpustack_models.api.api_metrics import labels

rf = RequestFactory()


@pytest.mark.parametrize(
    ("method", "query", "kwargs", "route", "expected"),
    [
        ("get", "", {"plural": "modelartifacts", "namespace": "ns", "name": "a"}, "", ("get", "modelartifacts")),
        ("get", "", {"plural": "modelartifacts", "namespace": "ns"}, "", ("list", "modelartifacts")),
        ("get", "watch=true", {"plural": "modelartifacts"}, "", ("watch", "modelartifacts")),
        ("get", "watch=1", {"plural": "nodemodelstores", "name": "n"}, "", ("watch", "nodemodelstores")),
        ("get", "watch=false", {"plural": "modelprefetches"}, "", ("list", "modelprefetches")),
        ("head", "", {"plural": "modelartifacts", "name": "a"}, "", ("get", "modelartifacts")),
        ("post", "", {"plural": "modelartifacts", "namespace": "ns"}, "", ("create", "modelartifacts")),
        ("put", "", {"plural": "modelartifacts", "name": "a"}, "", ("update", "modelartifacts")),
        ("patch", "", {"plural": "modelartifacts", "name": "a"}, "", ("patch", "modelartifacts")),
        ("delete", "", {"plural": "modelartifacts", "name": "a"}, "", ("delete", "modelartifacts")),
        ("delete", "", {"plural": "modelartifacts"}, "", ("deletecollection", "modelartifacts")),
        ("get", "", {"plural": "secrets-of-a-tenant", "name": "x"}, "", ("get", "unknown")),
        (
            "get",
            "",
            {"plural": "modelartifacts", "name": "a", "subresource": "status"},
            "",
            ("get", "modelartifacts/status"),
        ),
        (
            "get",
            "",
            {"plural": "modelartifacts", "name": "a", "subresource": "zz"},
            "",
            ("get", "modelartifacts/unknown"),
        ),
        ("get", "", {"namespace": "ns", "name": "a"}, "modelartifacts/progress", ("get", "modelartifacts/progress")),
        ("get", "", {}, "/apis", ("get", "/apis")),
        ("post", "", {}, "/internal/v1/tickets", ("post", "/internal/v1/tickets")),
    ],
)
def test_it_labels_requests_in_kubernetes_terms_without_names(method, query, kwargs, route, expected):
    request = getattr(rf, method)("/x" + (f"?{query}" if query else ""))
    assert labels(request, kwargs, route) == expected


def test_it_labels_an_unknown_method_other():
    request = rf.generic("BREW", "/x")
    assert labels(request, {"plural": "modelartifacts"}, "") == ("other", "modelartifacts")
    assert labels(request, {}, "/apis") == ("other", "/apis")


def test_every_placement_outcome_is_a_series_before_the_first_review():
    from prometheus_client import REGISTRY

    from gpustack_models.api.api_metrics import PLACEMENT_OUTCOMES

    for outcome in PLACEMENT_OUTCOMES:
        assert (
            REGISTRY.get_sample_value("gpustack_models_placement_webhook_calls_total", {"outcome": outcome}) is not None
        )
