"""The informers (``manage.py runinformers``): list-then-watch of the storage CRDs, Nodes and the plugin's
Pods, their events coalesced per object into batches, written to the mirror on one path.

- ``listwatch``: the informers of each kind;
- ``coalescing``: events coalesced per object and sent as one Celery task;
- ``mirror`` / ``batches``: applying objects to the mirror's rows, safe under repeated and reordered delivery;
- ``lag``: the mirror's lag, from an event's arrival to its row's commit.
"""
