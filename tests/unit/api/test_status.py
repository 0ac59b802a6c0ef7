"""One Status for every error the API answers: our own, storage errors told at v1, and every other error
mapped to its reason."""

import json

import pytest
from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions as drf

from gpustack_models import kube
from gpustack_models.api.resources import ResourceView
from gpustack_models.api.status import exception_handler


def render(exc, view=None):
    response = exception_handler(exc, {"view": view})
    return response.status_code, json.loads(response.content)


def test_it_answers_our_own_errors_as_status():
    code, body = render(kube.Forbidden("no", details={"kind": "modelartifacts"}))
    assert code == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "no",
        "reason": "Forbidden",
        "code": 403,
        "details": {"kind": "modelartifacts"},
    }


def test_it_tells_storage_errors_at_v1():
    upstream = {"kind": "Status", "code": 400, "reason": "BadRequest", "message": 'X in version "v1alpha1" ...'}
    code, body = render(kube.error_for(400, upstream))
    assert code == 400 and body["message"] == 'X in version "v1" ...'


@pytest.mark.parametrize(
    "exc, code, reason",
    [
        (drf.MethodNotAllowed("OPTIONS"), 405, "MethodNotAllowed"),
        (drf.NotAcceptable(), 406, "NotAcceptable"),
        (drf.ParseError(), 400, "BadRequest"),
        (drf.NotAuthenticated(), 401, "Unauthorized"),
        (RequestDataTooBig(), 413, "RequestEntityTooLarge"),
        (ZeroDivisionError(), 500, "InternalError"),
    ],
)
def test_it_maps_every_other_error_to_its_reason(exc, code, reason):
    got_code, body = render(exc, ResourceView())
    assert (got_code, body["reason"], body["code"]) == (code, reason, code)


def test_it_names_the_body_types_a_view_takes_on_415():
    view = ResourceView()
    view.request = type("R", (), {"method": "PATCH"})()
    code, body = render(drf.UnsupportedMediaType("application/strategic-merge-patch+json"), view)
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    assert body["message"].endswith(
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )
