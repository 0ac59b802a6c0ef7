"""The shape of the code base: which package may import what (import-linter's contracts, pyproject.toml),
how long a function may grow, and that the image carries the product only."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "gpustack_models"
MAX_FUNCTION_LINES = 40
MAX_FILE_LINES = 500
MAX_CLASS_LINES = 300


def modules(root: Path):
    for path in sorted(root.rglob("*.py")):
        if "migrations" not in path.parts and "generated" not in path.parts:  # generated: the gRPC stubs
            yield path


def imported(path: Path) -> set[str]:
    """Absolute names of the gpustack_models modules ``path`` imports."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n.startswith("gpustack_models")}


@pytest.mark.parametrize("module", ["gpustack_models.plugin.engine.jobs", "gpustack_models.sources"])
def test_it_keeps_django_out_of_the_engine_and_the_sources(module):
    loaded = "sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework'))"
    code = f"import sys, {module}; print({loaded})"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_it_keeps_the_import_contracts():
    """Which package may import what is import-linter's, from the contracts of pyproject.toml
    (``[tool.importlinter]``): the roles' layers (local above everything, each role above what it builds
    on, none importing another), the engine and the sources without Django, DRF or the Kubernetes client,
    the kinds without the API, and no import circle between the modules of a package."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_it_ships_no_development_code_in_product_modules():
    offenders = []
    for path in modules(PACKAGE):
        if "local" in path.relative_to(PACKAGE).parts:
            continue
        offenders += [f"{path.relative_to(REPO)}: {n}" for n in imported(path) if n.startswith("gpustack_models.local")]
    assert offenders == []
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "gpustack_models/local/" in ignored and "!tests/" not in ignored
    runtime = (REPO / "requirements.txt").read_text().lower()
    for tool in ("pytest", "playwright", "ruff", "hadolint"):
        assert not re.search(rf"^{tool}", runtime, re.M), tool


def function_lengths():
    for path in modules(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
            if docstring and len(body) > 1:
                body = body[1:]
            yield path, node, node.end_lineno - body[0].lineno + 1


def test_it_keeps_functions_short():
    long = [f"{p.relative_to(REPO)}:{n.lineno} {n.name} ({lines})" for p, n, lines in function_lengths()
            if lines > MAX_FUNCTION_LINES]  # fmt: skip
    assert long == []


def test_it_keeps_files_and_classes_small():
    """No module of ``gpustack_models/`` (migrations and generated stubs aside) over ``MAX_FILE_LINES`` lines,
    no class over ``MAX_CLASS_LINES`` (from its ``class`` line to its last, decorators not counted)."""
    big = []
    for path in modules(PACKAGE):
        text, name = path.read_text(), path.relative_to(REPO)
        if len(text.splitlines()) > MAX_FILE_LINES:
            big.append(f"{name} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            lines = node.end_lineno - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if lines > MAX_CLASS_LINES:
                big.append(f"{name}:{node.lineno} class {node.name} ({lines} lines)")
    assert big == []


def test_it_documents_the_layout_it_has():
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 5)]
    listed = set(re.findall(r"`gpustack_models/([a-z_]+)/`", layout))
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == packages - {"migrations", "management"}


def test_it_names_the_same_failure_reasons_in_the_engine_and_the_kind():
    from gpustack_models.kinds import FAILURE_REASONS
    from gpustack_models.kinds.nodemodelstore import UNKNOWN_REASON
    from gpustack_models.plugin.engine import REASONS

    # The kind's set is the engine's plus what the plugin reports for a failure it cannot name.
    assert set(REASONS) | {UNKNOWN_REASON} == set(FAILURE_REASONS)


def test_it_gives_no_two_modules_of_different_packages_one_name():
    by_name: dict[str, list[str]] = {}
    for path in modules(PACKAGE):
        if path.name not in ("__init__.py", "apps.py", "urls.py") and "management" not in path.parts:
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
