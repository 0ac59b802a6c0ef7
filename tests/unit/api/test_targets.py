"""Names and query parameters, read as kube-apiserver reads them."""

import pytest

from gpustack_models.api.targets import Query, Target
from gpustack_models.kinds import MODEL_ARTIFACT, NODE_MODEL_STORE
from gpustack_models.kube.errors import BadRequest, NotFound


@pytest.mark.parametrize("name", [".", "..", "a/b", "a%2Fb", "%2E", "100%"])
def test_it_refuses_path_segments_kube_apiserver_refuses(name):
    with pytest.raises(BadRequest):
        Target.checked(MODEL_ARTIFACT, "ns", name)
    with pytest.raises(BadRequest):
        Target.checked(MODEL_ARTIFACT, name, "x")


@pytest.mark.parametrize("name", ["?watch=true", "x#y", "UPPER", "a b", "-a", "a-", "a" * 254, "a..b"])
def test_it_finds_no_object_behind_a_name_no_object_can_have(name):
    with pytest.raises(NotFound):
        Target.checked(MODEL_ARTIFACT, "ns", name)


def test_it_takes_dns_subdomains_and_quotes_every_segment():
    target = Target.checked(MODEL_ARTIFACT, "team-a", "qwen-2.5.instruct")
    assert (
        target.storage_path() == "/apis/worker.gpustack.ai/v1alpha1/namespaces/team-a/modelartifacts/qwen-2.5.instruct"
    )
    assert target.storage_path(name="") == "/apis/worker.gpustack.ai/v1alpha1/namespaces/team-a/modelartifacts"
    assert (
        Target(NODE_MODEL_STORE, "", "a?b").storage_path() == "/apis/worker.gpustack.ai/v1alpha1/nodemodelstores/a%3Fb"
    )
    with pytest.raises(NotFound):
        Target.checked(MODEL_ARTIFACT, "a" * 64, "x")  # a namespace is a DNS label


@pytest.mark.parametrize(
    "query, watch",
    [
        ("", False),
        ("watch=true", True),
        ("watch=1", True),
        ("watch=on", True),
        ("watch=", True),
        ("watch=yes", True),
        ("watch=false", False),
        ("watch=FALSE", False),
        ("watch=0", False),
        ("watch=true&watch=false", True),
        ("watch=false&watch=true", False),
        ("limit=5", False),
    ],
)
def test_it_decides_watch_as_kube_apiserver_does(query, watch):
    assert Query(query).watch is watch


def test_it_forwards_what_it_parsed():
    query = Query("watch=false&watch=true&labelSelector=a%3Db&limit=5&fieldSelector=x")
    assert query.upstream(watch=False) == "labelSelector=a%3Db&limit=5&fieldSelector=x"
    assert query.upstream(watch=True, fieldSelector="metadata.name=n") == (
        "labelSelector=a%3Db&limit=5&watch=true&fieldSelector=metadata.name%3Dn"
    )
    assert Query("includeObject=Object&includeObject=None").get("includeObject") == "Object"
