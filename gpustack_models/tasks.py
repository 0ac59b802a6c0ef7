"""Celery tasks. Each takes ids or small payloads and is safe to run twice, in any order."""

import socket

from celery import shared_task


@shared_task(name="gpustack_models.ping")
def ping(payload: str) -> dict:
    """Answer with the payload and this worker's host: a health check of the broker round trip."""
    return {"payload": payload, "host": socket.gethostname()}
