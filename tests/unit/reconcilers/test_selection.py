"""Label selectors, matched as Kubernetes matches them."""

import pytest

from gpustack_models.reconcilers.selection import selector_matches


@pytest.mark.parametrize(
    "selector, labels, matches",
    [
        ({"matchLabels": {"tier": "gpu"}}, {"tier": "gpu", "zone": "a"}, True),
        ({"matchLabels": {"tier": "gpu"}}, {"tier": "cpu"}, False),
        ({"matchLabels": {"tier": "gpu"}}, {}, False),
        ({}, {"anything": "x"}, True),  # an empty selector selects every node, as in Kubernetes
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "tpu"]}]}, {"tier": "tpu"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, {"tier": "cpu"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
        (
            {"matchLabels": {"tier": "gpu"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"tier": "gpu", "zone": "b"},
            False,
        ),
    ],
)
def test_label_selectors_match_as_kubernetes_does(selector, labels, matches):
    assert selector_matches(selector, labels) is matches
