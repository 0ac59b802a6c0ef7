"""The worker's background work: the informers (``runinformers``) and the reconcilers Celery runs.

- ``informers``: list-then-watch of the storage CRDs, Nodes and plugin Pods into Celery tasks;
- ``mirror``: applying those objects to the mirror's rows, safe under repeated and reordered delivery;
- ``reactions``: what each mirrored change enqueues;
- ``resolution``: a source to a commit and a manifest digest;
- ``node_stores``: each plugin node's NodeModelStore and its spec;
- ``rollup``: the artifacts' ``status.nodes``;
- ``prefetches``: ModelPrefetch status;
- ``writes``: field managers, paths and conditions shared by the writers.
"""
