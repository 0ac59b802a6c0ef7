"""Prometheus metrics of the service's roles.

- ``registry``: one registry to scrape per process, and its metrics port;
- ``roles``: the informers', the Celery worker's and beat's metrics.
"""
