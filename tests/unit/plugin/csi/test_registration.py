"""Socket paths: one a unix socket cannot bind is refused, naming its setting."""

import pytest

from gpustack_models.plugin.csi.registration import SocketPathError, check_socket_path


def test_it_refuses_socket_paths_a_unix_socket_cannot_bind():
    assert check_socket_path("/" + "s" * 106, "X") == "/" + "s" * 106
    with pytest.raises(SocketPathError, match="108 bytes, a unix socket path has at most 107"):
        check_socket_path("/" + "s" * 107, "GPUSTACK_PLUGIN_CSI_SOCKET")
    with pytest.raises(SocketPathError, match="absolute"):
        check_socket_path("csi.sock", "X")
