"""Relaying a watch from kube-apiserver, on the event loop: an open watch holds no thread.

The upstream watch is opened with aiohttp (``open_watch``) and its newline-delimited events are passed
through the renderer's transform (v1 objects, one-row Tables, PartialObjectMetadata) as they arrive.
When the server stops (SIGTERM), ``close_watches`` ends every open watch at once: each client sees its
watch end cleanly and watches again from its last resourceVersion (through kube-apiserver, from another
replica), and the process does not wait out its graceful timeout for streams that never end.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse

from gpustack_models import kube

log = logging.getLogger(__name__)

_open: set = set()  # the upstream responses of the watches this process relays (touched on its event loop)


def close_watches() -> int:
    """End every open watch (on the event loop's thread); how many there were."""
    upstreams = list(_open)
    for upstream in upstreams:
        upstream.close()
    return len(upstreams)


async def open_watch(path: str, query: str, headers: dict):
    client = kube.default()
    session = client.async_session()
    return await session.get(
        client.url(path, query),
        headers={"Accept": "application/json", **client.auth_headers(), **headers},  # headers may ask for a Table
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
    )


async def read_and_close(upstream) -> bytes:
    try:
        return await upstream.read()
    finally:
        upstream.release()


def relay(path: str, query: str, headers: dict, transform) -> StreamingHttpResponse:
    """Open the upstream watch and stream it, each event line through ``transform``; the error answer of
    kube-apiserver raises its ``StatusError``."""
    upstream = async_to_sync(open_watch)(path, query, headers)
    if upstream.status != 200:
        body = async_to_sync(read_and_close)(upstream)
        raise kube.error_for(upstream.status, body)
    response = StreamingHttpResponse(stream_events(upstream, transform), content_type="application/json")
    response["Cache-Control"] = "no-cache, private"
    return response


async def stream_events(upstream, transform):
    """Relay newline-delimited watch events, transformed, until either side ends."""
    buffer = b""
    _open.add(upstream)
    try:
        async for chunk in upstream.content.iter_any():
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield transform(line) + b"\n"
        if buffer.strip():
            yield transform(buffer) + b"\n"
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        # The upstream connection broke: end the watch; the client watches again from its last version.
        log.info("watch stream from kube-apiserver ended: %s", exc)
    except Exception:
        log.exception("watch stream failed")
    finally:
        _open.discard(upstream)
        upstream.release()
        upstream.close()
