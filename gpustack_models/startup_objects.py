"""Setting aside what a process made while starting, so the garbage collector's full collections keep pace.

CPython collects its oldest generation (every reference cycle that lived a while) only once the objects
promoted into it since the last full collection number a quarter of those it held then. A process that has
imported Django, Celery and the Kubernetes client holds about 190,000 such objects, so it waits for some
47,000 new ones. Cycles that are few objects but much memory reach that late: each task that fails or
retries leaves one (Celery's exception info and its frames), and Python 3.11's copy of each frame's code
positions is thousands of small tuples the collector does not count. Under the soak, each Celery pool
process grew about 1 MB a minute, and a third to a half of that was such garbage, freed by one full
collection.

``set_aside_startup_objects`` runs once a process has started (a pool process once forked, an API worker once
it has loaded the application). It collects what starting left behind, freezes the survivors
(``gc.freeze``: modules, classes, settings, never garbage), and collects once more so the next full
collection waits on a quarter of what the process made since, not of everything it imported.
"""

import gc


def set_aside_startup_objects() -> int:
    """Freeze what the process holds now; returns how many objects were set aside."""
    gc.collect()
    gc.freeze()
    gc.collect()  # a full collection over what is left (nothing) sets the next one's threshold from it
    return gc.get_freeze_count()
