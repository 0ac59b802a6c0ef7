"""What the mirror reads of a Namespace: its prefetch byte limit per node, from its annotation."""

import pytest


@pytest.mark.parametrize(
    "value, limit", [("1000", 1000), ("0", 0), ("-5", None), ("lots", None), (None, None)],
)  # fmt: skip
def test_a_namespaces_byte_limit_is_read_from_its_annotation_and_a_bad_one_ignored(value, limit):
    from gpustack_models.informers.mirror import PREFETCH_BYTES_ANNOTATION, _namespace_fields

    annotations = {} if value is None else {PREFETCH_BYTES_ANNOTATION: value}
    obj = {"metadata": {"name": "tenant", "annotations": annotations}}
    assert _namespace_fields(obj) == {"prefetch_bytes_per_node": limit}


@pytest.mark.parametrize(
    "entry, reason",
    [
        ({"state": "Failed", "reason": "AccessDenied"}, "AccessDenied"),
        ({"state": "Failed", "reason": "DiskOnFire"}, "Unknown"),
        ({"state": "Failed"}, "Unknown"),
        ({"state": "Ready", "reason": "AccessDenied"}, ""),
    ],
)
def test_an_entrys_reason_is_one_of_the_fixed_reasons_and_only_while_failed(entry, reason):
    from gpustack_models.informers.mirror import _entry_values

    assert _entry_values({"digest": "sha256:" + "a" * 64, **entry})["reason"] == reason
