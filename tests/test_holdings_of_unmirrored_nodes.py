"""A node's holdings (the digests placed on it, with their graces and pins) go when the node is deleted, not
when the mirror has not seen the node yet: the informers list Pods and Nodes apart, so a plugin's Pod can be
mirrored first, and the minute's resync then reconciles a node with no Node row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpustack_models import models
from gpustack_models.reconcilers import node_stores

pytestmark = pytest.mark.django_db

DIGEST = "sha256:" + "e" * 64


def test_a_node_not_mirrored_yet_keeps_its_holdings_and_a_deleted_one_loses_them():
    grace_ends = timezone.now() + timedelta(minutes=5)
    models.Holding.objects.create(node="gpu-7", digest=DIGEST, collect_time=grace_ends)
    models.PluginPod.objects.create(
        namespace="gpustack", name="plugin-gpu-7", node="gpu-7", ready=True, resource_version=3
    )

    assert node_stores.reconcile_node_store("gpu-7") == "unknown-node"
    assert list(models.Holding.objects.filter(node="gpu-7").values_list("digest", "collect_time")) == [
        (DIGEST, grace_ends)
    ]

    models.Node.objects.create(name="gpu-7", resource_version=9, deleted=True)  # its tombstone
    assert node_stores.reconcile_node_store("gpu-7") == "no-node"
    assert not models.Holding.objects.filter(node="gpu-7").exists()
