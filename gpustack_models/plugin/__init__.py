"""The node plugin (``python -m gpustack_models.plugin --node NAME``, the DaemonSet's entry point).

- ``engine``: downloading, verifying, caching and publishing a digest's files, capacity and eviction
  (no Django, no Kubernetes);
- ``peers``: fetching a digest's segments from other nodes' plugins and the hub at once, and serving what
  the node holds to them;
- ``node``: the Kubernetes glue (the node's store watched, its status written, the HTTPS endpoints, the
  serving certificate);
- ``csi``: the CSI Identity and Node services, bind mounts, the kubelet registration;
- ``https_server``: the HTTPS server the node's and the peers' endpoints share (TLS over ``guarded_http``);
- ``environment`` and ``__main__``: its settings and its start, without Django or the ``kubernetes`` package
  (every GPU node runs it: ``tests/test_plugin_footprint.py`` checks what a working plugin imports).
"""
