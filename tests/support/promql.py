"""The metric names the chart's PrometheusRule and Grafana dashboard read, by Prometheus's own grammar
(``promql_parser``, the Rust ``promql-parser`` crate's bindings), and which of them a scrape of the roles
that export them lacks.

- ``metric_names(expr)``: every metric an expression selects (``foo{a="b"}``, ``{__name__="foo"}``, inside
  functions, aggregations, binary operations, ranges and subqueries); a selector whose name is a regular
  expression, or none, is refused: it could not be checked;
- ``grafana_expr(expr)``: a dashboard's query as PromQL (Grafana's interval variables as a duration; the
  other variables stand inside label values, where PromQL takes any text);
- ``rule_exprs(objects)`` / ``dashboard_exprs(dashboard)``: every ``(where, expr)`` of a rendered
  PrometheusRule / a dashboard's panels and its variables' ``label_values(...)`` queries;
- ``home(name)``: the roles that export a metric (each of them must), by its prefix;
- ``missing(exprs, scraped)``: ``(where, name, role)`` for every metric an expression names that the scrape
  of one of its roles lacks (a histogram's ``_bucket``, ``_sum`` and ``_count`` are samples of their own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

INTERVALS = re.compile(r"\$\{?(__rate_interval|__interval|__range)\}?")
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<query>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)

# The first prefix a name starts with names its roles (each must export it).
HOMES = (
    ("aggregator_", ("kube-apiserver",)),
    ("gpustack_models_api_", ("api",)),
    ("gpustack_models_placement_", ("api",)),
    ("gpustack_models_plugin_", ("plugin",)),
    ("gpustack_models_informer_", ("informers",)),
    ("gpustack_models_leader_election_", ("informers-elected", "beat-elected")),
    ("gpustack_models_tasks_sent_", ("informers", "beat")),
    ("gpustack_models_", ("celery",)),
)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects; ``ValueError`` when it is no PromQL or a selector has no plain name."""
    tree = promql_parser.parse(expr)
    names: set[str] = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(_name(node))
        return True

    promql_parser.walk(tree, visit)
    return names


def _name(selector) -> str:
    if selector.name:
        return selector.name
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__" and matcher.op == promql_parser.MatchOp.Equal:
            return matcher.value
    raise ValueError(f"a selector without a plain metric name cannot be checked: {selector}")


def grafana_expr(expr: str) -> str:
    """A dashboard query as PromQL: ``$__rate_interval`` and its kin become ``5m``."""
    return INTERVALS.sub("5m", expr)


def rule_exprs(objects: Iterable[dict]) -> list[tuple[str, str]]:
    found = []
    for obj in objects:
        if obj.get("kind") != "PrometheusRule":
            continue
        for group in obj["spec"]["groups"]:
            for rule in group["rules"]:
                found.append((f"rule {rule.get('alert') or rule.get('record')}", rule["expr"]))
    return found


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    found = []
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                found.append((f"panel {panel.get('title')!r} {target.get('refId')}", grafana_expr(target["expr"])))
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        match = LABEL_VALUES.match(query or "") if variable.get("type") == "query" else None
        if variable.get("type") == "query" and not match:
            raise ValueError(f"variable {variable.get('name')}: not a label_values(query, label): {query!r}")
        if match:
            found.append((f"variable {variable['name']}", grafana_expr(match.group("query"))))
    return found


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def home(name: str) -> tuple[str, ...]:
    for prefix, roles in HOMES:
        if name.startswith(prefix):
            return roles
    raise ValueError(f"no role is known to export {name}")


def sample_names(text: str) -> set[str]:
    """The names of a scrape's samples (``x_total``, ``x_bucket``, ``x_sum``, ``x_count``, gauges' own)."""
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def missing(exprs: Iterable[tuple[str, str]], scraped: Mapping[str, set[str]]) -> list[tuple[str, str, str]]:
    """``(where, name, role)`` of every name an expression selects that the scrape of one of its roles lacks."""
    gaps = []
    for where, expr in exprs:
        for name in sorted(metric_names(expr)):
            gaps += [(where, name, role) for role in home(name) if name not in scraped[role]]
    return gaps
