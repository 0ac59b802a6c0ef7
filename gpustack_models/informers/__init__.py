"""The informers (``manage.py runinformers``): list-then-watch of the storage CRDs, Nodes and the plugin's
Pods, their events coalesced per object into batches, written to the mirror on one path.

- ``listwatch``: the informers of each kind;
- ``coalescing``: events coalesced per object and sent as one Celery task;
- ``sending``: Celery tasks sent by name (nothing here imports the reconcilers' task module);
- ``mirror``: applying objects to the mirror's rows in batches (one event: a batch of one), safe under
  repeated and reordered delivery;
- ``reactions``: what a mirrored change enqueues, as the reconcilers declare it (``reacts_to``);
- ``lag``: the mirror's lag, from an event's arrival to its row's commit.
"""
