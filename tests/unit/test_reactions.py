"""The reactions to the mirror's changes, declared by the reconcilers, and the tasks sent by name."""

import pytest
from celery import current_app

from gpustack_models.informers import mirror, sending
from gpustack_models.informers.reactions import reactions_to, reacts_to
from gpustack_models.reconcilers import task_names, tasks


def names_in(module) -> set[str]:
    return {value for key, value in vars(module).items() if key.isupper() and isinstance(value, str)}


def test_every_mirrored_kind_has_the_reactions_its_reconcilers_declare():
    declared = {resource: sorted(f"{r.__module__}.{r.__name__}" for r in reactions_to(kind))
                for resource, kind in mirror.KINDS.items()}  # fmt: skip
    r = "gpustack_models.reconcilers."
    assert declared == {
        "modelartifacts": [r + "node_labels.artifact_changed", r + "resolution.artifact_changed"],
        "modelprefetches": [r + "selection.prefetch_changed"],
        "nodes": [r + "node_labels.node_changed", r + "selection.node_changed"],
        "pods": [r + "selection.plugin_pod_changed"],
        "nodemodelstores": [
            r + "node_labels.store_changed",
            r + "node_stores.reconcile_and_roll_up",
            r + "store_events.record_entry_events",
        ],
        "namespaces": [r + "node_stores.namespace_changed"],
    }


def test_each_name_sent_is_a_task_the_worker_defines():
    sent = names_in(sending) | names_in(task_names)
    assert len(sent) == 13
    registered = {name for name in current_app.tasks if name.startswith("gpustack_models.")}
    assert sent <= registered
    assert tasks.mirror_events.name == sending.MIRROR_EVENTS and tasks.rollup_digest.name == task_names.ROLLUP_DIGEST


def test_a_kind_without_reactions_is_an_error_and_a_declaration_counts_once():
    kind = mirror.Kind("unmirrored", mirror.Node, False, lambda obj: {})
    with pytest.raises(LookupError, match="unmirrored"):
        reactions_to(kind)

    def reaction(before, after, namespace, name):
        pass

    reacts_to(kind)(reaction)
    reacts_to(kind)(reaction)
    assert reactions_to(kind) == [reaction]
