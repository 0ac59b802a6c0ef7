"""``python -m gpustack_models.plugin --node NAME [--role all|mounter|node]``: the node plugin, the
DaemonSet's entry point.

It runs without Django and without the ``kubernetes`` client package, so the process on every GPU node
holds only what it uses (see ``environment`` and ``kube.credentials``); ``tests/test_plugin_footprint.py``
holds it to that.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gpustack_models import env_vars as shared
from gpustack_models.env_vars import ImproperlyConfigured
from gpustack_models.kube import Kube
from gpustack_models.kube.credentials import CredentialsError
from gpustack_models.plugin.csi.mounter import Mounter
from gpustack_models.plugin.csi.registration import SocketPathError, check_socket_path, registration_socket
from gpustack_models.plugin.environment import PluginEnvironment, credentials
from gpustack_models.plugin.node.agent import Plugin
from gpustack_models.stop_signals import on_stop_signals

ROLES = ("all", "mounter", "node")
# A stop signal ends the node role (and "all") within this, whatever hangs (the stacks of its threads are logged
# then): a role stops within 10 s, the downloads' checkpoints taking at most 5 of them (``agent.STOP_SECONDS``).
STOP_DEADLINE_SECONDS = 9.0


class StartError(Exception):
    """A setting the plugin cannot start with: printed as it is, exit status 2."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpustack_models.plugin",
        description="The node plugin: hold the digests this node's NodeModelStore lists, report them, serve "
        "live bytes.",
    )
    parser.add_argument("--node", required=True, help="the node this plugin runs on (its NodeModelStore's name)")
    parser.add_argument(
        "--role",
        choices=ROLES,
        default="all",
        help="mounter: the CSI driver and its mounts only (privileged); node: everything else (non-root);"
        " all: both in one process",
    )
    return parser.parse_args(argv)


def run(node: str, role: str) -> None:
    env = PluginEnvironment.read()
    if role != "node":
        check_csi_paths(env.csi_socket_for(node), env.registration_dir)
    if role != "mounter" and not env.has_cert_files() and not env.cert_from_api:
        raise StartError(
            "GPUSTACK_PLUGIN_TLS_CERT_FILE and GPUSTACK_PLUGIN_TLS_KEY_FILE are required"
            " (or GPUSTACK_PLUGIN_CERT_FROM_API=true: the API issues the certificate)"
        )
    client = Kube(credentials(env.data_dir), timeout=shared.kube_request_timeout())
    if role == "mounter":
        mounter = Mounter(env.mounter(node), client)
        on_stop_signals(mounter.stopping.set)  # no deadline: marked by an uninstall, it drains for its grace period
        mounter.run()
        return
    plugin = Plugin(env.plugin(node, role), client)
    on_stop_signals(plugin.stopping.set, deadline=STOP_DEADLINE_SECONDS)
    plugin.run()


def check_csi_paths(csi_socket: str, registration_dir: str) -> None:
    try:
        check_socket_path(csi_socket, "GPUSTACK_PLUGIN_CSI_SOCKET")
        if registration_dir:
            check_socket_path(registration_socket(registration_dir), "GPUSTACK_PLUGIN_REGISTRATION_DIR")
    except SocketPathError as exc:
        raise StartError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        logging.basicConfig(level=shared.log_level(), format=shared.LOG_FORMAT)
        for name in shared.QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        run(args.node, args.role)
    except (StartError, ImproperlyConfigured, CredentialsError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
