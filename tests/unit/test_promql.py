"""The checker of the chart's alert and dashboard expressions (``tests.support.promql``): the metric names it
reads out of PromQL, and the gaps it reports against scrapes, made-up names included."""

from __future__ import annotations

import pytest

from tests.support.promql import dashboard_exprs, grafana_expr, home, metric_names, missing, rule_exprs, sample_names

SCRAPE = """# HELP gpustack_models_tasks_total Celery tasks ended, by outcome.
# TYPE gpustack_models_tasks_total counter
gpustack_models_tasks_total{task="t",outcome="success"} 3.0
# HELP gpustack_models_mirror_lag_seconds Lag.
# TYPE gpustack_models_mirror_lag_seconds histogram
gpustack_models_mirror_lag_seconds_bucket{le="1.0",resource="r"} 1.0
gpustack_models_mirror_lag_seconds_bucket{le="+Inf",resource="r"} 1.0
gpustack_models_mirror_lag_seconds_count{resource="r"} 1.0
gpustack_models_mirror_lag_seconds_sum{resource="r"} 0.5
# HELP gpustack_models_resolutions_total Resolutions.
# TYPE gpustack_models_resolutions_total counter
"""


def test_it_reads_every_selector_through_functions_aggregations_operators_ranges_and_subqueries():
    expr = """
        histogram_quantile(0.99, sum by (namespace, le) (rate(a_bucket{namespace="ns", verb!="watch"}[5m])))
        / ignoring (reason) group_left sum without (pod) (increase(b_total{reason=~"c_total|d"}[15m] offset 1h))
        > bool 0.5
        or absent({__name__="e", lease="f"}) unless on (x) max_over_time(g[10m:1m]) and - h @ 100
    """
    assert metric_names(expr) == {"a_bucket", "b_total", "e", "g", "h"}


def test_label_values_keywords_and_durations_are_no_metric_names():
    expr = 'sum by (le, rate) (rate(x{by="sum", without=~"on|ignoring", offset="5m"}[1h30m])) > 1e3'
    assert metric_names(expr) == {"x"}


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(x[5m])",  # unbalanced
        'x{a="b"',  # an open matcher
        "rate(x[5q])",  # no such unit
        "x $y",  # a Grafana variable PromQL cannot read
        '{__name__=~"gpustack_.*"}',  # a name no scrape can be checked against
        'sum({job="x"})',  # no name at all
    ],
)
def test_it_refuses_what_is_no_checkable_promql(expr):
    with pytest.raises(ValueError):
        metric_names(expr)


def test_grafana_intervals_become_a_duration_and_other_variables_stay_in_label_values():
    expr = 'sum(rate(x_total{namespace=~"$namespace"}[$__rate_interval])) + rate(y[${__interval}])'
    assert grafana_expr(expr) == 'sum(rate(x_total{namespace=~"$namespace"}[5m])) + rate(y[5m])'
    assert metric_names(grafana_expr(expr)) == {"x_total", "y"}


def test_it_reads_rules_nested_panels_and_label_values_variables():
    rule = {"kind": "PrometheusRule", "spec": {"groups": [{"rules": [{"alert": "A", "expr": "a > 1"}]}]}}
    assert rule_exprs([{"kind": "ConfigMap"}, rule]) == [("rule A", "a > 1")]
    dashboard = {
        "panels": [
            {
                "title": "row",
                "panels": [{"title": "inner", "targets": [{"refId": "A", "expr": "rate(b[$__rate_interval])"}]}],
            },
            {"title": "text"},
        ],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "ns", "type": "query", "query": {"query": 'label_values(c{x="y"}, namespace)'}},
            ]
        },
    }
    assert dashboard_exprs(dashboard) == [("panel 'inner' A", "rate(b[5m])"), ("variable ns", 'c{x="y"}')]
    dashboard["templating"]["list"].append({"name": "q", "type": "query", "query": "query_result(up)"})
    with pytest.raises(ValueError, match="label_values"):
        dashboard_exprs(dashboard)


def test_a_scrape_names_its_samples_a_histogram_by_bucket_sum_and_count_and_no_empty_family():
    names = sample_names(SCRAPE)
    assert names == {
        "gpustack_models_tasks_total",
        "gpustack_models_mirror_lag_seconds_bucket",
        "gpustack_models_mirror_lag_seconds_count",
        "gpustack_models_mirror_lag_seconds_sum",
    }


def test_it_reports_a_made_up_name_a_family_without_series_and_a_metric_of_the_wrong_role():
    scraped = {"celery": sample_names(SCRAPE), "api": set(), "informers": set(), "beat": set()}
    exprs = [
        ("rule Good", "histogram_quantile(0.9, sum by (le) (rate(gpustack_models_mirror_lag_seconds_bucket[5m])))"),
        ("rule Good too", 'sum(rate(gpustack_models_tasks_total{outcome="failure"}[5m]))'),
        ("rule Typo", "sum(rate(gpustack_models_taks_total[5m]))"),
        ("rule Histogram named bare", "gpustack_models_mirror_lag_seconds > 1"),
        ("rule No series yet", "gpustack_models_resolutions_total > 0"),
        ("rule Not the API's", "gpustack_models_api_requests_total > 0"),
        ("panel Sent", "gpustack_models_tasks_sent_total"),
    ]
    assert missing(exprs, scraped) == [
        ("rule Typo", "gpustack_models_taks_total", "celery"),
        ("rule Histogram named bare", "gpustack_models_mirror_lag_seconds", "celery"),
        ("rule No series yet", "gpustack_models_resolutions_total", "celery"),
        ("rule Not the API's", "gpustack_models_api_requests_total", "api"),
        ("panel Sent", "gpustack_models_tasks_sent_total", "informers"),
        ("panel Sent", "gpustack_models_tasks_sent_total", "beat"),
    ]


def test_every_metric_has_a_home_and_an_unknown_prefix_is_refused():
    assert home("aggregator_unavailable_apiservice") == ("kube-apiserver",)
    assert home("gpustack_models_plugin_used_percent") == ("plugin",)
    assert home("gpustack_models_leader_election_leading") == ("informers-elected", "beat-elected")
    assert home("gpustack_models_queue_depth") == ("celery",)
    with pytest.raises(ValueError):
        home("node_filesystem_avail_bytes")
