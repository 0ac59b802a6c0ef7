"""Celery tasks sent by name: whoever sends a task (the informers, a reconciler's reaction) never imports the
worker's task module, which imports them.

``send(name, *args, **kwargs)`` is ``delay(*args, **kwargs)`` of the task registered under ``name`` where
this process registered it (the Celery worker: the task's own options, ``CELERY_TASK_ALWAYS_EAGER``);
elsewhere (the informers' process) the same message goes out by name through the Celery app: one name,
one route, one queue either way.
"""

from __future__ import annotations

from celery import current_app

# The mirror tasks the informers send (``reconcilers.tasks`` defines them under these names).
MIRROR_EVENT = "gpustack_models.mirror_event"
MIRROR_EVENTS = "gpustack_models.mirror_events"
MIRROR_BATCH = "gpustack_models.mirror_batch"
MIRROR_PRUNE = "gpustack_models.mirror_prune"
RECORD_INFORMER = "gpustack_models.record_informer"


def send(name: str, *args, **kwargs) -> None:
    """Enqueue the task ``name`` with these arguments (see the module's docstring)."""
    task = current_app.tasks.get(name)
    if task is not None:
        task.delay(*args, **kwargs)
    else:
        current_app.send_task(name, args, kwargs)
