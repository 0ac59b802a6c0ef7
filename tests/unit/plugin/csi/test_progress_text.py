"""The messages a Pod's events show while its model is not Ready on the node, sizes as the tables print them."""

from __future__ import annotations

import pytest

from gpustack_models.plugin.csi.progress_text import not_ready_message
from gpustack_models.plugin.engine.jobs import Entry

GiB = 1024**3


@pytest.mark.parametrize(
    "entry, says",
    [
        (None, "model qwen is waiting to be downloaded on this node"),
        (Entry("d", "Downloading", 0, 0), "model qwen is waiting to be downloaded on this node"),
        (
            Entry("d", "Downloading", int(7.4 * GiB), int(3.1 * GiB)),
            "model qwen is downloading on this node: 41 % (3.1Gi of 7.4Gi)",
        ),
        (
            Entry("d", "Failed", 10, 0, reason="IntegrityMismatch", message="a.bin: bad", retry_time=1_000_030.5),
            "model qwen failed to download on this node (IntegrityMismatch: a.bin: bad); retrying in 31 s (at ",
        ),
        (
            Entry("d", "Failed", 10, 0, reason="SourceUnavailable", retry_time=None),
            "model qwen failed to download on this node (SourceUnavailable); retrying",
        ),
    ],
)
def test_it_tells_a_person_what_the_node_does_with_the_model(entry, says):
    assert not_ready_message("qwen", entry, now=1_000_000.0).startswith(says)


def test_its_sizes_are_the_tables_sizes():
    """The plugin prints sizes with the one formatter of ``kubectl get`` and the console, not one of its own."""
    message = not_ready_message("qwen", Entry("d", "Downloading", 1023 + 1024, 1023), now=0.0)
    assert message.endswith("(1023B of 2.0Ki)")
