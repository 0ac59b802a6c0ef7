"""Kubernetes errors at the client edge: one class per reason, kube-apiserver's Status kept as it came."""

import json

from gpustack_models import kube


def test_it_makes_the_exception_of_each_reason():
    assert isinstance(kube.error_for(404, b'{"kind":"Status","reason":"NotFound","message":"x"}'), kube.NotFound)
    exists = kube.error_for(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
    assert isinstance(exists, kube.AlreadyExists) and isinstance(exists, kube.Conflict)
    deleting = kube.error_for(409, {"reason": "Conflict", "message": "object is being deleted: x"})
    assert type(deleting) is kube.Conflict and deleting.being_deleted
    assert isinstance(kube.error_for(410, b"{}"), kube.Expired)
    odd = kube.error_for(418, b"not json")
    assert type(odd) is kube.StatusError and odd.code == 418 and odd.message == "not json"


def test_it_keeps_kube_apiservers_status_as_it_came():
    body = {"kind": "Status", "apiVersion": "v1", "code": 422, "reason": "Invalid", "details": {"causes": []}}
    assert kube.error_for(422, json.dumps(body).encode()).to_status() == body
