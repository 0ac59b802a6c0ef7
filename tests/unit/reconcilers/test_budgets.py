"""A namespace's share of a node from the settings and its administrators' annotations on the Namespace."""

import pytest
from django.test import override_settings

from gpustack_models.reconcilers.budgets import Share, share_of

DIGESTS = "worker.gpustack.ai/prefetch-digests-per-node"
PINNING = "worker.gpustack.ai/pinning-allowed"


def namespace(**annotations) -> dict:
    return {"metadata": {"name": "team", "annotations": annotations}}


@override_settings(PREFETCH_BYTES_PER_NODE=0, PREFETCH_DIGESTS_PER_NODE=64)
def test_without_annotations_a_namespace_has_the_settings_share_and_may_not_pin():
    assert share_of("team", namespace(), None) == Share(bytes=0, digests=64, pinning=False)
    assert share_of("team", None, None) == Share(bytes=0, digests=64, pinning=False)


@override_settings(PREFETCH_BYTES_PER_NODE=0, PREFETCH_DIGESTS_PER_NODE=64)
def test_the_administrators_annotations_override_the_settings():
    body = namespace(**{DIGESTS: "8", PINNING: "true"})
    assert share_of("team", body, 1000) == Share(bytes=1000, digests=8, pinning=True)
    assert share_of("team", namespace(**{DIGESTS: "0"}), None).digests == 0


@pytest.mark.parametrize("value", ["-1", "many", "", " 8x"])
@override_settings(PREFETCH_DIGESTS_PER_NODE=64)
def test_a_digest_limit_that_is_not_a_count_is_ignored(value):
    assert share_of("team", namespace(**{DIGESTS: value}), None).digests == 64


@pytest.mark.parametrize("value", ["True", "yes", "1", "", "false"])
def test_pinning_is_allowed_by_the_exact_value_true_only(value):
    assert share_of("team", namespace(**{PINNING: value}), None).pinning is False
