"""Accept and Content-Type negotiation, as kube-apiserver reads them."""

import pytest
from django.test import RequestFactory

from gpustack_models.api.negotiation import KubeContentNegotiation, parse_accept
from gpustack_models.api.parsers import OBJECT_PARSERS, PATCH_PARSERS
from gpustack_models.api.renderers import LIST_RENDERERS, OBJECT_RENDERERS, PROGRESS_RENDERERS
from gpustack_models.kube.errors import NotAcceptable

KUBECTL_TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
GC_METADATA = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)


def choose(accept, renderers=OBJECT_RENDERERS):
    request = RequestFactory().get("/", HTTP_ACCEPT=accept) if accept is not None else RequestFactory().get("/")
    renderer, media = KubeContentNegotiation().select_renderer(request, [r() for r in renderers])
    return renderer.kube_as or "Object"


def test_it_orders_media_ranges_by_quality_then_position():
    ranges = parse_accept("text/plain;q=0.5, application/json;q=0.9, */*, application/yaml;q=0.9")
    assert [r.type for r in ranges] == ["*/*", "application/json", "application/yaml", "text/plain"]
    assert ranges[1].params == {} and ranges[1].q == 0.9


def test_it_keeps_parameters_and_treats_a_bad_quality_as_zero():
    (media,) = parse_accept('application/json; as="Table" ; g=meta.k8s.io;v=v1;q=x')
    assert media.params == {"as": "Table", "g": "meta.k8s.io", "v": "v1"}
    assert media.q == 0.0


@pytest.mark.parametrize(
    "accept, expected",
    [
        (None, "Object"),
        ("", "Object"),
        ("application/json", "Object"),
        ("*/*", "Object"),
        (KUBECTL_TABLE, "Table"),
        ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", "PartialObjectMetadata"),
        ("application/vnd.kubernetes.protobuf,application/json", "Object"),
        # A Table of another version or group is not ours to serve: the next range wins.
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", "Object"),
        ("application/json;as=Table;v=v1;g=meta.k8s.io;q=0.1,application/json;q=0.9", "Object"),
    ],
)
def test_it_picks_the_representation_of_a_single_object(accept, expected):
    assert choose(accept) == expected


@pytest.mark.parametrize(
    "accept, expected",
    [
        (None, "Object"),
        ("application/json", "Object"),
        (KUBECTL_TABLE, "Table"),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", "Object"),
    ],
)
def test_it_answers_progress_as_an_object_or_a_table(accept, expected):
    assert choose(accept, PROGRESS_RENDERERS) == expected
    with pytest.raises(NotAcceptable):
        choose("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", PROGRESS_RENDERERS)


def test_it_answers_the_garbage_collectors_metadata_list():
    assert choose(GC_METADATA, LIST_RENDERERS) == "PartialObjectMetadataList"
    # A list is never answered with the single-object form, nor a get with the list form.
    with pytest.raises(NotAcceptable):
        choose("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", LIST_RENDERERS)
    with pytest.raises(NotAcceptable):
        choose("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1", OBJECT_RENDERERS)


def test_it_refuses_a_protobuf_only_client_naming_what_it_serves():
    with pytest.raises(NotAcceptable) as refused:
        choose("application/vnd.kubernetes.protobuf")
    assert refused.value.code == 406
    assert "application/json;as=Table;v=v1;g=meta.k8s.io" in refused.value.message


def test_it_picks_the_parser_by_media_type():
    negotiation = KubeContentNegotiation()
    factory = RequestFactory()

    def parser(content_type, parsers):
        request = factory.post("/", data=b"{}", content_type=content_type)
        chosen = negotiation.select_parser(request, [p() for p in parsers])
        return chosen.media_type if chosen else None

    assert parser("application/json; charset=utf-8", OBJECT_PARSERS) == "application/json"
    assert parser("application/yaml", OBJECT_PARSERS) == "application/yaml"
    assert parser("application/merge-patch+json", PATCH_PARSERS) == "application/merge-patch+json"
    assert parser("application/strategic-merge-patch+json", PATCH_PARSERS) is None
    assert parser("application/json", PATCH_PARSERS) is None
