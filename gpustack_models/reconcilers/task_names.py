"""The names of the reconcilers' Celery tasks: ``tasks`` defines each under its name, and the reactions and
reconcilers that enqueue one send it by name (``informers.sending``), so none of them imports ``tasks``."""

RESOLVE_ARTIFACT = "gpustack_models.resolve_artifact"
RECONCILE_NODE_STORE = "gpustack_models.reconcile_node_store"
RETARGET_PREFETCH = "gpustack_models.retarget_prefetch"
RETARGET_NODE = "gpustack_models.retarget_node"
RECONCILE_PREFETCH = "gpustack_models.reconcile_prefetch"
ROLLUP_DIGEST = "gpustack_models.rollup_digest"
RECORD_EVENTS = "gpustack_models.record_events"
RECONCILE_PLACEMENT_LABELS = "gpustack_models.reconcile_placement_labels"
