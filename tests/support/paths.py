"""Where the suite keeps its state, and the port every test plugin serves on."""

from pathlib import Path

from gpustack_models.local.cluster import Ports

REPO = Path(__file__).resolve().parents[2]
TEST_STATE = REPO / ".local" / "test"
PLUGIN_PORT = Ports.free().apiserver  # every test plugin serves on its own loopback address, this port
