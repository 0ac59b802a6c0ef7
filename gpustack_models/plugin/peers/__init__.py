"""Peer fan-out: a plugin fetches a digest's segments from other nodes' plugins and the hub at once, and
serves what its node holds.

- ``contract``: what a peer serves, to whom, under which names;
- ``swarm``: which segment from which source (the ``Board``), with ``segments`` (what it schedules:
  segments, peers' state, the tuning) and ``choosing`` (how it picks a fetching thread's next segment);
- ``fanout``: carrying a download's fetching out over the board's sources;
- ``recheck``: finding the peer whose bytes a file failed its hash with, so that only it is banned;
- ``peer_client``: asking a peer for bytes;
- ``peer_server``: the peer endpoints of the node's plugin.
"""
