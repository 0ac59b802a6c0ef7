import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models import kube
from gpustack_models.api.authentication import AUTH_CONFIGMAP, RequestHeaderConfig
from gpustack_models.api.server import KEEPALIVE_SECONDS
from gpustack_models.telemetry import registry


class Command(BaseCommand):
    help = (
        "Serve the aggregated API worker.gpustack.ai/v1 over HTTPS on gunicorn's ASGI worker, extended to "
        "pass the client certificate (front-proxy authentication)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=settings.API_PORT)
        parser.add_argument("--bind", action="append", help="host:port (repeatable); default GPUSTACK_API_BIND")
        parser.add_argument("--workers", type=int, default=settings.API_WORKERS)
        parser.add_argument("--certfile", default=settings.TLS_CERT_FILE)
        parser.add_argument("--keyfile", default=settings.TLS_KEY_FILE)

    def handle(self, *args, port, bind, workers, certfile, keyfile, **options):
        for path in (certfile, keyfile):
            if not os.path.exists(path):
                raise CommandError(f"serving certificate file {path} does not exist (GPUSTACK_TLS_CERT_FILE/KEY_FILE)")
        self.check_client_ca()
        binds = bind or ([f"127.0.0.1:{port}", f"[::1]:{port}"] if port != settings.API_PORT else settings.API_BIND)
        argv = [sys.executable, "-m", "gunicorn", "config.asgi:application", *gunicorn_options(workers)]
        # The client CAs come from the extension-apiserver-authentication ConfigMap, watched by each worker
        # (api.server_tls): no --ca-certs file.
        argv += ["--certfile", certfile, "--keyfile", keyfile]
        for address in binds:
            argv += ["--bind", address]
        sys.stdout.flush()
        os.environ["GPUSTACK_SERVER_ROLE"] = "api"
        # Several worker processes: one scrape of /metrics sums them (a fresh directory per start).
        registry.use_multiprocess("api")
        os.execv(sys.executable, argv)

    def check_client_ca(self) -> None:
        """The ConfigMap of the client CAs (the front proxy's and the cluster's) is readable: a clear error
        here rather than workers failing to start."""
        try:
            RequestHeaderConfig.from_configmap(kube.default().get(AUTH_CONFIGMAP))
        except kube.StatusError as exc:
            raise CommandError(f"reading kube-system/extension-apiserver-authentication: {exc}") from None


def gunicorn_options(workers: int) -> list[str]:
    return [
        "--config",
        "python:gpustack_models.api.gunicorn_conf",  # its hooks: a worker's exit in the metrics
        "--worker-class",
        "gpustack_models.api.server.TLSASGIWorker",
        "--workers",
        str(workers),
        "--worker-connections",
        "2000",
        "--cert-reqs",
        "1",  # request a client certificate, do not require one
        "--graceful-timeout",
        "5",  # SIGTERM: open watches end at once (api.server), a request in flight gets this long
        "--timeout",
        "60",
        "--keep-alive",
        str(KEEPALIVE_SECONDS),  # beyond kube-apiserver's proxy's idle connections (api.server)
        "--no-control-socket",
        "--asgi-lifespan",
        "off",
        "--log-level",
        "warning",
    ]
