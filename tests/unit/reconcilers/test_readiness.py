"""The ModelArtifact's Ready condition: its content Ready on a node its own namespace asks for it on."""

import pytest

from gpustack_models.reconcilers.readiness import claim_ready, ready_of

R, D, F = "Ready", "Downloading", "Failed"


def test_nothing_asked_of_any_node_is_not_ready_whatever_other_tenants_hold():
    status, reason, message = ready_of(set(), {"n1": R, "n2": R})
    assert (status, reason) == ("False", "NotRequested")
    assert "create a ModelPrefetch" in message


@pytest.mark.parametrize(
    "wanted, states, expected",
    [
        ({"n1"}, {"n1": R}, ("True", "Ready", "ready on 1 of 1 node this namespace asks for it on")),
        ({"n1", "n2"}, {"n2": R, "n1": D}, ("True", "Ready", "ready on 1 of 2 nodes this namespace asks for it on")),
        ({"n1"}, {"n1": D, "n9": R}, ("False", "Downloading", None)),
        ({"n1", "n2"}, {"n1": F}, ("False", "Failed", None)),
        ({"n1"}, {}, ("False", "Pending", None)),
    ],
)
def test_ready_counts_only_the_nodes_the_namespace_asks_for(wanted, states, expected):
    status, reason, message = ready_of(wanted, states)
    assert (status, reason) == expected[:2]
    if expected[2]:
        assert message.startswith(expected[2]), message
    if status == "False":
        assert message.startswith(f"not ready yet on any of {len(wanted)} node"), message


def test_a_failure_points_at_degraded_and_a_claim_needs_no_download():
    assert ready_of({"n1"}, {"n1": F})[2].endswith("0 downloading, 1 failed (see Degraded)")
    assert claim_ready()[:2] == ("True", "ClaimSource")
