"""Where the suite keeps its state, and the ports every test plugin serves on."""

from pathlib import Path

from gpustack_models.local.cluster import Ports, free_port

REPO = Path(__file__).resolve().parents[2]
TEST_STATE = REPO / ".local" / "test"
PLUGIN_PORT = Ports.free().apiserver  # every test plugin serves on its own loopback address, this port
PEER_PORT = next(p for p in iter(free_port, None) if p != PLUGIN_PORT)  # ... and its peer endpoints on this one
