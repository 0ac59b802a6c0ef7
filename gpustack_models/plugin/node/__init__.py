"""The plugin's Kubernetes glue: the node's NodeModelStore watched and its status written from the engine,
the HTTPS endpoints, the serving certificate.

- ``agent``: the plugin process, which wires the engine, the peers, the CSI driver and the API together;
- ``status_writer``: the store's status, written on the thresholds the API promises;
- ``endpoints``: ``/readyz``, ``/livez``, ``/metrics`` and the live progress;
- ``serving_cert``: the serving certificate, issued by the API;
- ``cache_owner``: the cache handed to the non-root user that downloads (the Pod's init container).
"""
