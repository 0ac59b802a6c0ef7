"""Collection keeps to the ``collectTime`` a node's spec announces, not to the period of the pass that checks it.

The pass runs every ``GPUSTACK_COLLECTION_INTERVAL_SECONDS`` (a minute by default) and looks one interval
ahead: a node whose grace or retention ends before the next pass is reconciled at that moment (a task with
an ETA), and a grace that begins with less than an interval to run sends its own reconcile for its end.
Before, a digest stayed in ``spec.models`` up to a whole interval past its ``collectTime``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from gpustack_models import models
from gpustack_models.reconcilers import collection, node_stores
from gpustack_models.reconcilers.references import Assignment
from gpustack_models.reconcilers.task_names import RECONCILE_NODE_STORE

pytestmark = pytest.mark.django_db

DIGEST = "sha256:" + "c" * 64


def test_the_pass_names_each_node_with_the_moment_its_grace_ends_up_to_one_interval_ahead():
    now = timezone.now()
    models.Holding.objects.create(node="due", digest=DIGEST, collect_time=now - timedelta(seconds=1))
    models.Holding.objects.create(node="soon", digest=DIGEST, collect_time=now + timedelta(seconds=25))
    models.Holding.objects.create(node="soon", digest="sha256:" + "d" * 64, collect_time=now + timedelta(seconds=40))
    models.Holding.objects.create(node="later", digest=DIGEST, collect_time=now + timedelta(seconds=90))
    models.Holding.objects.create(node="held", digest=DIGEST)

    assert collection.collection_pass(now) == {"due": now - timedelta(seconds=1)}
    ahead = collection.collection_pass(now, ahead=60)
    assert ahead == {"due": now - timedelta(seconds=1), "soon": now + timedelta(seconds=25)}


@override_settings(COLLECTION_GRACE_SECONDS=30, COLLECTION_INTERVAL_SECONDS=60)
def test_a_grace_shorter_than_the_interval_sends_a_reconcile_for_its_end(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(node_stores, "send_at", lambda eta, name, *args: sent.append((eta, name, args)))
    now = timezone.now().replace(microsecond=250_000)
    node_stores.desired_models("n1", Assignment(held={DIGEST: False}), now)
    assert sent == []

    with django_capture_on_commit_callbacks(execute=True):
        spec = node_stores.desired_models("n1", Assignment(), now)  # nothing references it any more
    end = now.replace(microsecond=0) + timedelta(seconds=31)  # the grace, rounded up to whole seconds
    assert spec == [{"digest": DIGEST, "pinned": False, "collectTime": end.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    assert sent == [(end, RECONCILE_NODE_STORE, ("n1",))]

    # Reconciled again within the grace: no second task; at its end the digest leaves.
    node_stores.desired_models("n1", Assignment(), now + timedelta(seconds=10))
    assert len(sent) == 1
    assert node_stores.desired_models("n1", Assignment(), end) == []


@override_settings(COLLECTION_GRACE_SECONDS=600, COLLECTION_INTERVAL_SECONDS=60)
def test_a_grace_longer_than_the_interval_is_left_to_the_pass(monkeypatch):
    sent = []
    monkeypatch.setattr(node_stores, "send_at", lambda eta, name, *args: sent.append((eta, name, args)))
    now = timezone.now().replace(microsecond=0)
    node_stores.desired_models("n2", Assignment(held={DIGEST: False}), now)
    node_stores.desired_models("n2", Assignment(), now)
    assert sent == []
    assert collection.collection_pass(now + timedelta(seconds=550), ahead=60) == {"n2": now + timedelta(seconds=600)}
