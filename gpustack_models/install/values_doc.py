"""The chart's values table (``docs/values.md``), generated from ``values.schema.json`` and the defaults of
``values.yaml``: one row per value (its path, type, default and description), in the schema's order.

``python manage.py chartvalues`` writes it; ``--check`` (in ``make lint``) fails when it is stale. Every
property of the schema needs a description: one without is an error naming its path.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpustack_models.install.chart import CHART_DIR

DOC = Path(__file__).resolve().parents[2] / "docs" / "values.md"
HEADER = """# Chart values

Every value of the `gpustack-models` chart (`deploy/chart/gpustack-models`): its path, type, default (from
`values.yaml`; empty: unset) and what it does. Generated from `values.schema.json` by
`python manage.py chartvalues`; do not edit.

| Value | Type | Default | Description |
|---|---|---|---|
"""


class MissingDescription(ValueError):
    """A property of the schema without a description."""


def _type(schema: dict) -> str:
    kinds = schema.get("type", "any")
    text = " or ".join(kinds) if isinstance(kinds, list) else kinds
    if "enum" in schema:
        text += " (" + ", ".join(str(v) for v in schema["enum"]) + ")"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(defaults, name: str, schema: dict) -> str:
    if not isinstance(defaults, dict) or name not in defaults or "properties" in schema:
        return ""
    return "`" + _cell(json.dumps(defaults[name], separators=(", ", ": "))) + "`"


def rows(schema: dict, defaults, path: str = "") -> list[tuple[str, str, str, str]]:
    """(path, type, default, description) of every property under ``schema``, depth first."""
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        if not isinstance(sub, dict):  # a `false` schema: a key refused, not a value
            continue
        here = f"{path}.{name}" if path else name
        if not sub.get("description"):
            raise MissingDescription(f"{here}: no description in values.schema.json")
        out.append((here, _type(sub), _default(defaults, name, sub), sub["description"]))
        below = defaults.get(name) if isinstance(defaults, dict) else None
        out += rows(sub, below, here)
        items = sub.get("items")
        if isinstance(items, dict) and items.get("properties"):
            out += rows(items, None, here + "[]")
    return out


def values_doc(chart_dir: Path = CHART_DIR) -> str:
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}
    lines = [
        f"| `{path}` | {_cell(kind)} | {default} | {_cell(text)} |"
        for path, kind, default, text in rows(schema, defaults)
    ]
    return HEADER + "\n".join(lines) + "\n"


def stale(doc: Path = DOC, chart_dir: Path = CHART_DIR) -> bool:
    return not doc.exists() or doc.read_text() != values_doc(chart_dir)
