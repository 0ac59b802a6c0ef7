"""What a change of the mirror concerns: the reactions to each mirrored kind, declared by the reconcilers.

A reconciler module declares what it reacts to where it lives::

    @reacts_to(mirror.NODES)
    def node_changed(before, after, namespace, name): ...

A reaction takes the row's body before and after the change (``None``: no live object) and the object's
namespace and name, and enqueues idempotent tasks by name (``enqueue``); running one twice, or after a
later change, is harmless. The mirror tasks call ``react`` for each change they applied. Within
``once_per_key()`` (a batch of mirrored changes) each task is enqueued once per arguments, when the block
ends: one roll-up per digest and one reconcile per node for a whole batch.

Nothing here imports a reconciler: the reconcilers import this registry (the Celery worker imports them
all through its task module before it runs a mirror task).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

from gpustack_models.informers.mirror import Change, Kind
from gpustack_models.informers.sending import send

Reaction = Callable[[dict | None, dict | None, str, str], None]

_reactions: dict[str, list[Reaction]] = {}
_pending: contextvars.ContextVar[dict | None] = contextvars.ContextVar("pending_reactions", default=None)


def reacts_to(kind: Kind) -> Callable[[Reaction], Reaction]:
    """Declare the decorated function a reaction to every applied change of ``kind`` (in declaration
    order, after those declared before it)."""

    def register(reaction: Reaction) -> Reaction:
        declared = _reactions.setdefault(kind.resource, [])
        if reaction not in declared:
            declared.append(reaction)
        return reaction

    return register


def reactions_to(kind: Kind) -> list[Reaction]:
    """The reactions declared for ``kind``; a kind with none is an error (its reconcilers were not loaded)."""
    declared = _reactions.get(kind.resource)
    if not declared:
        raise LookupError(f"no reaction declared for {kind.resource}: the reconcilers are not imported")
    return list(declared)


def react(kind: Kind, change: Change) -> None:
    """Run the reactions to a change of the mirror (what they enqueue is sent, or collected by
    ``once_per_key``)."""
    body = change.after or change.before or {}
    meta = body.get("metadata") or {}
    for reaction in reactions_to(kind):
        reaction(change.before, change.after, meta.get("namespace", ""), meta.get("name", ""))


def enqueue(name: str, *args, **kwargs) -> None:
    """Send the task ``name``, or inside ``once_per_key()`` collect it to send once at the block's end."""
    pending = _pending.get()
    if pending is None:
        send(name, *args, **kwargs)
    else:
        pending.setdefault((name, args, tuple(sorted(kwargs.items()))), (args, kwargs))


@contextlib.contextmanager
def once_per_key():
    """Collect the reactions enqueued inside the block and send each distinct one once at its end;
    yields the list that then holds ``[task name, args, kwargs]`` of each."""
    sent: list[list] = []
    token = _pending.set({})
    try:
        yield sent
    finally:
        pending = _pending.get()
        _pending.reset(token)
        for (name, _, _), (args, kwargs) in pending.items():
            send(name, *args, **kwargs)
            sent.append([name, list(args), kwargs])
