"""Where the suite keeps its state (its lane's own directory), and the ports every test plugin serves on."""

from gpustack_models.local.cluster import Ports, free_port
from tests.support.lanes import REPO, state_dir

TEST_STATE = state_dir()
PLUGIN_PORT = Ports.free().apiserver  # every test plugin serves on its own loopback address, this port
PEER_PORT = next(p for p in iter(free_port, None) if p != PLUGIN_PORT)  # ... and its peer endpoints on this one

__all__ = ["PEER_PORT", "PLUGIN_PORT", "REPO", "TEST_STATE"]
