"""An informer's metrics: its relists and watch restarts are series from its start, before the first of them."""

from prometheus_client import REGISTRY

from gpustack_models.informers.listwatch import Informer
from gpustack_models.kube.watch import WatchTarget


def test_an_informers_relists_and_watch_restarts_start_at_zero_and_count_after_the_first():
    informer = Informer(resource="unit-listwatch", target=WatchTarget("/api/v1/nodes"), sink=object())
    labels = {"resource": "unit-listwatch"}
    for name in ("gpustack_models_informer_relists_total", "gpustack_models_informer_watch_restarts_total"):
        assert REGISTRY.get_sample_value(name, labels) == 0
    informer.watching("1")
    informer.watching("2")
    assert REGISTRY.get_sample_value("gpustack_models_informer_watch_restarts_total", labels) == 1
