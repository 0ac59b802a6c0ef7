"""What the node plugins call on the API process, under ``/internal/v1/`` (never the v1 group).

- ``tickets``: fetch tickets, what a plugin needs to download a digest;
- ``mounts``: mount references, asked before a plugin mounts an artifact into a Pod;
- ``certificates`` / ``signing``: the plugins' serving certificates, and their pure signing;
- ``urls``: the routes.
"""
