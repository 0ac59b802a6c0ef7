"""The image: the Dockerfile built here by buildah on a Debian base assembled by debootstrap (no registry is
reachable), checked for what the Dockerfile promises (non-root, no HEALTHCHECK, the product only) and
smoke-tested: Django's deployment checks with production settings, every role's entry point importable."""

from __future__ import annotations

import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.image_build import IMAGE, UNWANTED, context_dir
from tests.support.paths import REPO

STUBS = "gpustack_models/plugin/csi/generated"  # what `make protos` generates in a checkout, never tracked

PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "DATABASE_URL": "postgres://models:secret@postgres.example:5432/models",
    "CELERY_BROKER_URL": "redis://redis.example:6379/0",
    "GPUSTACK_CONSOLE_HTTPS": "true",
}


@pytest.fixture
def buildah(product_image):
    return product_image


def run_at_once(buildah, *runs: tuple[list[str], dict[str, str]]):
    """Containers of the image, one per ``(argv, env)``, run at the same time; their results in order."""
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: buildah.run(IMAGE, *run), runs))


def test_the_image_runs_as_a_non_root_user_with_no_healthcheck(buildah):
    config = buildah.config(IMAGE)
    oci = config["OCIv1"]["config"]
    assert oci["User"] == "10001"
    assert oci["Cmd"] == ["python", "manage.py", "runapiserver"]
    assert not (config.get("Docker", {}).get("config") or {}).get("Healthcheck")
    assert {"8443/tcp", "9443/tcp", "8000/tcp"} <= set(oci.get("ExposedPorts", {}))
    whoami = buildah.run(IMAGE, ["id", "-u"], {})
    assert whoami.stdout.strip() == "10001", whoami.stderr


def test_the_image_carries_the_product_and_its_runtime_requirements_only(buildah):
    probe = "import os, sys; print(' '.join(p for p in sys.argv[1:] if os.path.exists(p)))"
    present, listed = run_at_once(
        buildah, (["python", "-c", probe, *UNWANTED], {}), (["pip", "list", "--format=freeze"], {})
    )
    assert present.returncode == 0 and present.stdout.strip() == "", present.stdout + present.stderr
    assert listed.returncode == 0, listed.stderr
    packages = listed.stdout.lower().replace("_", "-")
    for runtime in ("django==", "celery==", "gunicorn==", "huggingface-hub==", "modelscope==", "kubernetes=="):
        assert runtime in packages, runtime
    for dev in ("pytest", "ruff", "schemathesis", "hadolint"):
        assert dev not in packages, dev


def test_the_deployment_checks_pass_with_production_settings(buildah):
    api = dict(PRODUCTION, GPUSTACK_SERVER_ROLE="api", GPUSTACK_PLUGIN_CA_FILE="/etc/gpustack-models/plugin-ca/tls.crt")
    # Every role's entry point loads (the CSI stubs the image copies with the package included).
    roles = [
        "import django; django.setup()",
        "import gpustack_models.management.commands.runapiserver",
        "import gpustack_models.management.commands.runinformers",
        "import gpustack_models.plugin.__main__",
        "import gpustack_models.plugin.csi.generated.csi_pb2",
        "import config.celery",
    ]
    console, checked, loaded, refused = run_at_once(
        buildah,
        (["python", "manage.py", "check", "--deploy", "--fail-level", "WARNING"], PRODUCTION),
        (["python", "manage.py", "check"], api),
        (["python", "-c", "; ".join(roles)], PRODUCTION),
        # Without a SECRET_KEY the image refuses to start (its built-in key is for checkouts only).
        (["python", "manage.py", "check"], {k: v for k, v in PRODUCTION.items() if k != "SECRET_KEY"}),
    )
    assert console.returncode == 0, console.stdout + console.stderr
    assert "System check identified no issues" in console.stdout
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert refused.returncode != 0 and "SECRET_KEY is required" in refused.stderr


def test_the_image_builds_from_a_fresh_clone_and_compiles_its_own_stubs(buildah):
    """The build's context is the checkout's tracked files alone, as a fresh clone: no gRPC stubs a checkout
    generated. The image compiles them in its build stage, imports them, and carries no grpcio-tools."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True).stdout
    tracked = set(filter(None, listed.decode().split("\0")))
    context = context_dir()
    copied = {str(path.relative_to(context)) for path in context.rglob("*") if not path.is_dir()}
    assert "Dockerfile" in copied and not copied - tracked, sorted(copied - tracked)[:20]
    assert not (context / STUBS).exists() and not any(name.startswith(f"{STUBS}/") for name in tracked)
    probe = (
        "import importlib.util, os, shutil\n"
        "from gpustack_models.plugin.csi.generated import csi_pb2_grpc, pluginregistration_pb2_grpc\n"
        "print(importlib.util.find_spec('grpc_tools'), shutil.which('protoc'), os.path.exists('/opt/protoc'))"
    )
    ran = buildah.run(IMAGE, ["python", "-c", probe], {})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == ["None", "None", "False"], ran.stdout
