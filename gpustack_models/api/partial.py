"""PartialObjectMetadata(List): objects reduced to their metadata, as the garbage collector's metadata
client asks for them (``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``).

Only the envelope is decoded (msgspec structs); metadata travels as raw JSON, rewritten to v1 as bytes.
The structs here are shared with ``tables``.
"""

from __future__ import annotations

import msgspec

from gpustack_models.api.conversion import public_bytes

META = "meta.k8s.io/v1"


class Head(msgspec.Struct):
    name: str = ""
    creationTimestamp: str = ""
    resourceVersion: str = ""
    annotations: dict = {}


class Item(msgspec.Struct):
    metadata: msgspec.Raw = msgspec.Raw(b"{}")
    spec: dict = {}
    status: dict = {}


class ItemList(msgspec.Struct):
    metadata: dict = {}
    items: list[Item] = []


class Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


decode_list = msgspec.json.Decoder(ItemList).decode
decode_item = msgspec.json.Decoder(Item).decode
decode_head = msgspec.json.Decoder(Head).decode
decode_event = msgspec.json.Decoder(Event).decode
encode = msgspec.json.Encoder().encode


def partial(metadata: msgspec.Raw) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": msgspec.Raw(public_bytes(bytes(metadata)))}


def partial_bytes(data: bytes) -> bytes:
    return encode(partial(decode_item(data).metadata))


def partial_list_bytes(data: bytes) -> bytes:
    lst = decode_list(data)
    return encode(
        {
            "kind": "PartialObjectMetadataList",
            "apiVersion": META,
            "metadata": lst.metadata,
            "items": [partial(item.metadata) for item in lst.items],
        }
    )


def partial_event_bytes(line: bytes) -> bytes:
    """One watch event whose object becomes PartialObjectMetadata."""
    event = decode_event(line)
    if event.type == "ERROR":
        return line
    return encode({"type": event.type, "object": msgspec.Raw(partial_bytes(bytes(event.object)))})
