"""Request bodies: decoded by type, refused with a Status when they do not decode or have the wrong shape."""

import io

import pytest
from django.test import override_settings

from gpustack_models.api.parsers import (
    ApplyPatchParser,
    JSONParser,
    JSONPatchParser,
    MergePatchParser,
    YAMLParser,
)
from gpustack_models.kube.errors import BadRequest, RequestEntityTooLarge


def parse(parser, body: bytes):
    return parser().parse(io.BytesIO(body))


def test_it_decodes_each_body_type():
    assert parse(JSONParser, b'{"a": 1}') == {"a": 1}
    assert parse(YAMLParser, b"a: 1\nb: [x]\n") == {"a": 1, "b": ["x"]}
    assert parse(JSONPatchParser, b'[{"op": "remove", "path": "/a"}]') == [{"op": "remove", "path": "/a"}]
    assert parse(MergePatchParser, b'{"a": null}') == {"a": None}
    assert parse(ApplyPatchParser, b"metadata:\n  name: x\n") == {"metadata": {"name": "x"}}


@pytest.mark.parametrize(
    "parser, body, message",
    [
        (JSONParser, b"{nope", "could not be decoded"),
        (JSONParser, b"[1, 2]", "must be a JSON object"),
        (YAMLParser, b"a: [", "could not be decoded"),
        (JSONPatchParser, b'{"op": "add"}', "JSON array of operations"),
        (MergePatchParser, b"[]", "merge patch must be a JSON object"),
        (ApplyPatchParser, b"- a\n- b\n", "apply patch must be an object"),
    ],
)
def test_it_refuses_what_does_not_decode_or_has_the_wrong_shape(parser, body, message):
    with pytest.raises(BadRequest) as refused:
        parse(parser, body)
    assert refused.value.code == 400 and message in refused.value.message


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=64)
def test_it_refuses_a_body_over_the_limit():
    assert parse(JSONParser, b'{"a": "' + b"x" * 50 + b'"}')["a"] == "x" * 50
    with pytest.raises(RequestEntityTooLarge) as refused:
        parse(JSONParser, b'{"a": "' + b"x" * 100 + b'"}')
    assert refused.value.code == 413


BOMB = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("parser", [YAMLParser, ApplyPatchParser])
def test_it_refuses_yaml_aliases_before_building_anything(parser):
    with pytest.raises(BadRequest) as refused:
        parse(parser, BOMB)
    assert "aliases" in refused.value.message
    with pytest.raises(BadRequest):
        parse(parser, b"a: &x 1\nb: 2\n")  # an anchor alone is refused too


def test_it_refuses_deep_nesting():
    with pytest.raises(BadRequest) as refused:
        parse(YAMLParser, b"a: " + b"[" * 200 + b"]" * 200 + b"\n")
    assert "deeper" in refused.value.message
    assert parse(YAMLParser, b"a: " + b"[" * 50 + b"]" * 50 + b"\n")["a"]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_it_applies_the_limit_to_the_decoded_form():
    # YAML within the limit that is larger as JSON: every key and string gains its quotes.
    body = b"{" + b",".join(b"k%d: a" % i for i in range(14)) + b"}"
    assert len(body) <= 100
    with pytest.raises(RequestEntityTooLarge):
        parse(YAMLParser, body)
