"""What the API process keeps per caller is bounded by size as well as by time.

The TokenReview and SubjectAccessReview caches are attacked as a caller would attack them: many distinct
bearer tokens (each a real TokenReview at kube-apiserver) and many distinct users (each a real
SubjectAccessReview). Neither cache grows past its ``maxsize``; an answer evicted is asked again, and an
expired one is not served.
"""

from __future__ import annotations

import secrets

import pytest

from gpustack_models.api import authorization
from gpustack_models.api.authentication import KubeUser
from gpustack_models.kube import client
from gpustack_models.kube.reviews import TokenReviewer, TTLCache

MAXSIZE = 50


@pytest.fixture
def worker_identity(monkeypatch, worker_kube):
    """The in-process code talks to kube-apiserver as the worker (as the API process does)."""
    monkeypatch.setattr(client, "_default", worker_kube)
    return worker_kube


class CountingClient:
    """The real client, counting the reviews it sends."""

    def __init__(self, kube):
        self.kube, self.reviews = kube, 0

    def create(self, path, body):
        self.reviews += 1
        return self.kube.create(path, body)


def test_token_reviews_stay_within_maxsize_with_many_distinct_tokens(worker_kube, launcher):
    import yaml

    counting = CountingClient(worker_kube)
    reviewer = TokenReviewer(lambda: counting, ttl=60, maxsize=MAXSIZE)
    token = yaml.safe_load(launcher.service_kubeconfig.read_text())["users"][0]["user"]["token"]
    assert reviewer.review(token)["username"].endswith(":gpustack-models-worker")
    sizes = []
    for _ in range(4 * MAXSIZE):
        assert reviewer.review(secrets.token_urlsafe(32)) is None  # kube-apiserver rejects each
        sizes.append(len(reviewer._cache))
    assert max(sizes) == MAXSIZE, sizes
    assert counting.reviews == 1 + 4 * MAXSIZE
    # The real token's answer was evicted (oldest first): it is asked again, and answered right.
    assert reviewer.review(token)["username"].endswith(":gpustack-models-worker")
    assert counting.reviews == 2 + 4 * MAXSIZE
    assert reviewer.review(token) is not None and counting.reviews == 2 + 4 * MAXSIZE  # now cached again


def test_subject_access_reviews_stay_within_maxsize_with_many_distinct_users(worker_identity, monkeypatch):
    cache = TTLCache(maxsize=MAXSIZE)
    monkeypatch.setattr(authorization, "_cache", cache)
    attributes = authorization.ResourceAttributes("get", "worker.gpustack.ai", "v1", "modelartifacts", "default")
    sizes = []
    for i in range(3 * MAXSIZE):
        user = KubeUser(f"attacker-{i}-{secrets.token_hex(4)}", groups=("system:authenticated",))
        allowed, _ = authorization.review(user, attributes)
        assert not allowed
        sizes.append(len(cache))
    assert max(sizes) == MAXSIZE, sizes


class Clock:
    """Monotonic seconds that a test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expired_answers_are_not_served_and_leave_first():
    clock = Clock()
    cache = TTLCache(maxsize=MAXSIZE, clock=clock)
    cache.set("old", 1, ttl=0.2)
    cache.set("fresh", 2, ttl=60)
    clock.now += 0.2
    assert cache.get("old") == 1  # served up to its last instant
    clock.now += 0.01
    assert cache.get("old") is None and len(cache) == 1
    cache.set("stale", 3, ttl=0.2)
    clock.now += 0.3
    for i in range(MAXSIZE - 1):
        cache.set(i, i, ttl=60)
    # The expired entry went, not a fresh one: "fresh" and all the new ones fit exactly.
    assert len(cache) == MAXSIZE and cache.get("fresh") == 2 and cache.get("stale") is None


def test_a_cache_needs_room_for_one_answer():
    with pytest.raises(ValueError):
        TTLCache(maxsize=0)
