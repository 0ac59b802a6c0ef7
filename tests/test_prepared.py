"""Querysets compiled once (``gpustack_models.prepared``) answer what the queryset answers, with each call's
values, on the real database; the placement webhook's holders through them are the ORM's holders."""

import pytest

from gpustack_models.models import Artifact, EntryState, Holding, NodeStore, SourceKind, StoreEntry
from gpustack_models.prepared import Prepared
from gpustack_models.webhooks import placement

HOSTILE = "x' OR '1'='1"


def digest(i):
    return "sha256:" + f"{i:064x}"


def artifact(name, *, namespace="team-a", digest_="", source=SourceKind.HUGGING_FACE, deleted=False):
    Artifact.objects.create(
        namespace=namespace, name=name, digest=digest_, source=source, deleted=deleted, resource_version=1
    )


def holding(node, digest_, state=EntryState.READY, *, held=True):
    store, _ = NodeStore.objects.get_or_create(name=node, defaults={"resource_version": 1})
    StoreEntry.objects.create(store=store, node=node, digest=digest_, state=state)
    if held:
        Holding.objects.create(node=node, digest=digest_)


def orm_holders(namespace, names):
    """The webhook's holders as the plain ORM reads them (the query the prepared one must equal)."""
    digests = dict(
        Artifact.objects.live()
        .filter(namespace=namespace, name__in=names)
        .exclude(digest="")
        .exclude(source=SourceKind.CLAIM)
        .values_list("name", "digest")
    )
    out = []
    for name in names:
        if digests.get(name):
            nodes = StoreEntry.objects.claimed().filter(digest=digests[name], state=EntryState.READY)
            nodes = list(nodes.order_by("node").values_list("node", flat=True)[: placement.MAX_NODES])
            if nodes:
                out.append(nodes)
    return out


@pytest.mark.django_db
def test_holders_answer_what_the_orm_answers_for_every_call_and_shape():
    artifact("qwen", digest_=digest(1))
    artifact("llama", digest_=digest(2))
    artifact("gone", digest_=digest(3), deleted=True)
    artifact("claim", digest_=digest(4), source=SourceKind.CLAIM)
    artifact("pending")
    artifact("qwen", namespace="team-b", digest_=digest(5))
    for i in range(placement.MAX_NODES + 3):
        holding(f"n-{i:03d}", digest(1))
    holding("m-1", digest(2))
    holding("m-2", digest(2), EntryState.DOWNLOADING)
    holding("m-3", digest(2), held=False)  # a report for a digest never placed there counts nowhere
    for d in (3, 4, 5):
        holding("m-4", digest(d))
    calls = [
        ("team-a", ["qwen"]),
        ("team-a", ["llama", "qwen"]),
        ("team-a", ["gone", "claim", "pending", "missing"]),
        ("team-b", ["qwen", "llama"]),
        ("team-a", ["llama"]),
        ("team-a", [HOSTILE]),
        (HOSTILE, ["qwen"]),
    ]
    for namespace, names in calls:
        assert placement.holders(namespace, names) == orm_holders(namespace, names), (namespace, names)
    assert placement.holders("team-a", ["llama", "qwen"])[0] == ["m-1"]
    assert len(placement.holders("team-a", ["qwen"])[0]) == placement.MAX_NODES
    assert placement.holders("team-b", ["qwen"]) == [["m-4"]]
    assert placement.holders("team-a", [HOSTILE]) == placement.holders(HOSTILE, ["qwen"]) == []


@pytest.mark.django_db
def test_a_value_is_a_parameter_never_sql():
    artifact(HOSTILE, digest_=digest(9))
    artifact("other", digest_=digest(8))
    names = Prepared(lambda ns, names: Artifact.objects.filter(namespace=ns, name__in=names).values_list("name"))
    assert names.rows("team-a", [HOSTILE]) == [(HOSTILE,)]
    assert names.rows("team-a", ["x"]) == []


@pytest.mark.django_db
def test_a_queryset_that_rewrites_its_values_is_refused():
    contains = Prepared(lambda name: Artifact.objects.filter(name__contains=name).values_list("name"))
    with pytest.raises(ValueError, match="placeholder"):
        contains.rows("qwen")
