"""The plugin's gRPC servers on their unix sockets, and its registration with the kubelet.

The kubelet's plugin watcher finds ``<registration dir>/model.csi.gpustack.ai-reg.sock``, calls
``GetInfo`` (type ``CSIPlugin``, the driver's name, the CSI socket's path as the endpoint, CSI versions
``1.0.0``), registers the driver and reports with ``NotifyRegistrationStatus``: what node-driver-registrar
does as a sidecar, served here by the plugin itself. The CSI socket's path must be the same on the host
and in the plugin's container (the kubelet dials it). Stale socket files are removed at start; the
registration socket is removed at exit (the kubelet then deregisters the driver), the CSI socket and the
mounts stay.
"""

from __future__ import annotations

import logging
import os
import stat
from concurrent import futures

import grpc

from gpustack_models.plugin.csi import DRIVER_NAME, SOCKET_PATH_MAX
from gpustack_models.plugin.csi.generated import csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ["1.0.0"]
CSI_PLUGIN = "CSIPlugin"


class SocketPathError(ValueError):
    pass


def check_socket_path(path: str, setting: str) -> str:
    """An absolute path a unix socket can bind (at most 107 bytes); ``SocketPathError`` says why not."""
    if not os.path.isabs(path):
        raise SocketPathError(f"{setting}={path!r}: must be an absolute path")
    if len(path.encode()) > SOCKET_PATH_MAX:
        raise SocketPathError(
            f"{setting}={path!r}: {len(path.encode())} bytes, a unix socket path has at most {SOCKET_PATH_MAX};"
            " choose a shorter one"
        )
    return path


def registration_socket(registration_dir: str) -> str:
    return os.path.join(registration_dir, f"{DRIVER_NAME}-reg.sock")


def remove_stale(path: str) -> None:
    """Remove a socket left by an earlier run; refuse to remove anything that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; not removing it")
    os.unlink(path)


def unix_server(path: str, add_services, threads: int = 8) -> grpc.Server:
    """A started gRPC server on the unix socket ``path`` (its directory made, a stale socket replaced),
    readable and writable by root only."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    remove_stale(path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="csi"))
    add_services(server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    os.chmod(path, 0o600)
    return server


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.registered: bool | None = None

    def GetInfo(self, request, context):
        return pluginregistration_pb2.PluginInfo(
            type=CSI_PLUGIN, name=DRIVER_NAME, endpoint=self.endpoint, supported_versions=SUPPORTED_VERSIONS
        )

    def NotifyRegistrationStatus(self, request, context):
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("the kubelet registered the CSI driver %s (endpoint %s)", DRIVER_NAME, self.endpoint)
        else:
            log.error(
                "THE KUBELET REFUSED TO REGISTER the CSI driver %s: %s; Pods cannot mount models on this node",
                DRIVER_NAME,
                request.error or "no reason given",
            )
        return pluginregistration_pb2.RegistrationStatusResponse()


class CsiServers:
    """The CSI socket (Identity and Node) and, with a registration directory, the registration socket."""

    def __init__(self, csi_socket: str, registration_dir: str | None, identity, node):
        self.csi_socket, self.identity, self.node = csi_socket, identity, node
        self.registration_path = registration_socket(registration_dir) if registration_dir else None
        self.registration = RegistrationService(csi_socket)
        self.servers: list[grpc.Server] = []

    def start(self) -> None:
        def csi_services(server):
            csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, server)
            csi_pb2_grpc.add_NodeServicer_to_server(self.node, server)

        self.servers.append(unix_server(self.csi_socket, csi_services))
        log.info("CSI driver %s serving on %s", DRIVER_NAME, self.csi_socket)
        if self.registration_path:
            check_socket_path(self.registration_path, "GPUSTACK_PLUGIN_REGISTRATION_DIR")
            add = pluginregistration_pb2_grpc.add_RegistrationServicer_to_server
            self.servers.append(unix_server(self.registration_path, lambda s: add(self.registration, s), threads=2))
            log.info("registering with the kubelet through %s", self.registration_path)

    def stop(self) -> None:
        if self.registration_path:
            try:
                os.unlink(self.registration_path)
            except FileNotFoundError:
                pass
        stopped = [server.stop(grace=2) for server in self.servers]  # together: the process stops in seconds
        for event in stopped:
            event.wait(3)
