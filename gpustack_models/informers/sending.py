"""Celery tasks sent by name: whoever sends a task (the informers, a reconciler's reaction) never imports the
reconcilers' task module, which imports them.

``send(name, *args, **kwargs)`` is ``delay(*args, **kwargs)`` of the task registered under ``name`` where
this process registered it (the Celery worker: the task's own options); elsewhere (the informers' process)
the same message goes out by name through the Celery app: one name, one route, one queue either way. Sent by
name, a task's result is ignored as the registered tasks' are (``CELERY_TASK_IGNORE_RESULT``): otherwise
Celery's Redis result backend subscribes to each task's result channel as it is sent, two more Redis commands
per task, for a result that never comes. With
``CELERY_TASK_ALWAYS_EAGER`` (tasks run where they are sent) a process loads the app's task modules first,
as a Celery worker does, so the task runs in it.
"""

from __future__ import annotations

from celery import current_app

# The mirror tasks the informers send (``reconcilers.tasks`` defines them under these names).
MIRROR_EVENT = "gpustack_models.mirror_event"
MIRROR_EVENTS = "gpustack_models.mirror_events"
MIRROR_BATCH = "gpustack_models.mirror_batch"
MIRROR_PRUNE = "gpustack_models.mirror_prune"
RECORD_INFORMER = "gpustack_models.record_informer"


def _registered(name: str):
    task = current_app.tasks.get(name)
    if task is None and current_app.conf.task_always_eager:
        current_app.loader.import_default_modules()  # Celery's task discovery, as a worker starts it
        task = current_app.tasks.get(name)
    return task


def send(name: str, *args, **kwargs) -> None:
    """Enqueue the task ``name`` with these arguments (see the module's docstring)."""
    task = _registered(name)
    if task is not None:
        task.delay(*args, **kwargs)
    else:
        current_app.send_task(name, args, kwargs, ignore_result=True)


def send_at(eta, name: str, *args) -> None:
    """Enqueue the task ``name`` to run at ``eta`` (an aware datetime), as ``send`` does. Where tasks run
    where they are sent (no ETA there) nothing is sent: the periodic pass that looks ahead catches the moment."""
    if current_app.conf.task_always_eager:
        return
    task = _registered(name)
    if task is not None:
        task.apply_async(args, eta=eta)
    else:
        current_app.send_task(name, args, eta=eta, ignore_result=True)
