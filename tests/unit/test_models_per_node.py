"""The per-node cap (``GPUSTACK_MODELS_PER_NODE``): by default the schema's limit of ``spec.models``, which
kube-apiserver enforces; a setting above that limit is refused at start, since no spec could hold it."""

import os
import subprocess
import sys

import yaml

from gpustack_models.reconcilers.references import MAX_MODELS
from tests.support.paths import REPO

CRD = REPO / "deploy" / "crds" / "worker.gpustack.ai_nodemodelstores.yaml"


def models_max_items() -> set[int]:
    """``maxItems`` of ``spec.models`` and ``status.models`` in every served version of the installed CRD."""
    crd = yaml.safe_load(CRD.read_text())
    found = set()
    for version in crd["spec"]["versions"]:
        properties = version["schema"]["openAPIV3Schema"]["properties"]
        found |= {properties[part]["properties"]["models"]["maxItems"] for part in ("spec", "status")}
    return found


def start_with(**env) -> subprocess.CompletedProcess:
    """Load the settings as every entry point does, without GPUSTACK_MODELS_PER_NODE unless given."""
    full = {k: v for k, v in os.environ.items() if k != "GPUSTACK_MODELS_PER_NODE"} | env
    code = "import django; django.setup(); from django.conf import settings; print(settings.MODELS_PER_NODE)"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, capture_output=True, text=True, timeout=60)


def test_the_cap_is_the_schemas_limit_by_default():
    assert models_max_items() == {MAX_MODELS}
    proc = start_with()
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) == MAX_MODELS


def test_a_cap_the_schema_cannot_hold_is_refused_at_start():
    proc = start_with(GPUSTACK_MODELS_PER_NODE=str(MAX_MODELS + 1))
    assert proc.returncode != 0
    complaint = f"GPUSTACK_MODELS_PER_NODE={MAX_MODELS + 1}: must be at most {MAX_MODELS}"
    assert "ImproperlyConfigured" in proc.stderr and complaint in proc.stderr, proc.stderr[-2000:]
