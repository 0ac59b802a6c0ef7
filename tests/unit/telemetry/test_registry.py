"""The metrics port's routing: GET /metrics only."""

from gpustack_models.telemetry.registry import metrics_app


def test_the_metrics_port_answers_get_metrics_only():
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("unit_total", "a counter", registry=registry).inc()
    app = metrics_app(registry)

    def call(method, path):
        answer = {}
        body = b"".join(
            app({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": ""}, lambda s, h: answer.update(status=s))
        )
        return answer["status"], body

    status, body = call("GET", "/metrics")
    assert status.startswith("200") and b"unit_total 1.0" in body
    for method, path in (("POST", "/metrics"), ("GET", "/"), ("GET", "/metrics/"), ("DELETE", "/metrics")):
        assert call(method, path)[0].startswith("404"), (method, path)
