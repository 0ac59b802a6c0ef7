"""The reconcilers Celery runs (``celery -A config worker`` and ``beat``): they read the mirror and write to
Kubernetes as the service.

- ``tasks``: the Celery tasks, thin entry points into the modules below; ``task_names``: their names, by
  which everything else sends them;
- what each mirrored change enqueues is declared where its reconciler lives (``@reacts_to`` of
  ``informers.reactions``): artifacts in ``resolution``; prefetches, nodes and plugin Pods in
  ``selection``; stores and namespaces in ``node_stores``, stores' Events in ``store_events``;
- ``resolution``, ``retries``, ``budgets``: a source to a commit and a manifest digest, tried again fairly;
- ``node_stores``, ``references``: each plugin node's NodeModelStore and the digests it is asked to hold;
- ``prefetches``, ``selection``: ModelPrefetch status and the nodes each targets;
- ``collection``, ``mount_checks``: what leaves the nodes' caches, and the mount references' ends;
- ``rollup``: the artifacts' ``status.nodes`` and ``Degraded``;
- ``node_labels``: the Nodes' placement labels (``GPUSTACK_PLACEMENT_MODE=nodeLabels``), which also reacts
  to stores, artifacts and nodes;
- ``events``, ``store_events``: Kubernetes Events;
- ``writes``: field managers, paths and conditions shared by the writers;
- ``beat_leader``: Celery beat sending only while it holds the Lease.
"""
