"""The chart's values table: one row per value of values.schema.json, its default from values.yaml, and a
property without a description refused by name."""

import json
import shutil

import pytest

from gpustack_models.install.chart import CHART_DIR
from gpustack_models.install.values_doc import DOC, MissingDescription, rows, stale, values_doc


def test_every_value_has_a_row_with_its_type_default_and_description():
    table = values_doc()
    for line in (
        '| `plugin.nodeSelector` | object | `{"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}` |',
        "| `api.podDisruptionBudget.maxUnavailable` | integer or string | `1` |",
        "| `certManager.issuerRef.kind` | string (Issuer, ClusterIssuer) |  |",
        "| `plugin.hostAliases[].ip` | string |  | An address. |",
        "| `global` | object |  |",
    ):
        assert line in table, line
    # A row per property, nested ones included, in the schema's order.
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    paths = [path for path, *_ in rows(schema, {})]
    assert paths[:2] == ["image", "image.repository"] and len(paths) == len(set(paths))
    assert table.count("\n| `") == len(paths)


def test_a_property_without_a_description_is_refused_by_its_path():
    schema = {
        "properties": {"api": {"type": "object", "description": "x", "properties": {"replicas": {"type": "integer"}}}}
    }
    with pytest.raises(MissingDescription, match=r"^api\.replicas: "):
        rows(schema, {})


def test_a_pipe_in_a_description_does_not_break_the_table():
    schema = {"properties": {"a": {"type": "string", "description": "x | y"}}}
    assert rows(schema, {"a": "b|c"})[0] == ("a", "string", '`"b\\|c"`', "x | y")


def test_the_committed_table_is_current_and_a_changed_schema_makes_it_stale(tmp_path):
    assert not stale()
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart, ignore=shutil.ignore_patterns("templates", "crds"))
    schema = json.loads((chart / "values.schema.json").read_text())
    schema["properties"]["image"]["description"] = "Changed."
    (chart / "values.schema.json").write_text(json.dumps(schema))
    assert stale(DOC, chart)
