"""A newcomer finds a module's tests by its name: every module of the download engine, the sources, the
kinds, the internal API and the webhooks has a ``test_<module>.py`` somewhere under ``tests/``."""

from __future__ import annotations

from tests.support.paths import REPO

PACKAGES = ("plugin/engine", "sources", "kinds", "internal", "webhooks")


def test_every_module_has_a_test_file_of_its_name():
    tests = {path.name for path in (REPO / "tests").rglob("test_*.py")}
    untested = [
        f"gpustack_models/{package}/{module.name}"
        for package in PACKAGES
        for module in sorted((REPO / "gpustack_models" / package).glob("*.py"))
        if module.name != "__init__.py" and f"test_{module.name}" not in tests
    ]
    assert untested == []
