"""The store's CapacityLow condition says the store's one capacity figure, as the console prints it."""

from types import SimpleNamespace

from gpustack_models.plugin.node.status_writer import StatusWriter

GiB, MiB = 2**30, 2**20


def test_capacity_low_says_the_capacity_figure():
    capacity = {"totalBytes": 252 * GiB, "storedBytes": 24 * MiB, "usedPercent": 85}
    engine = SimpleNamespace(entries=list, capacity=lambda: capacity, capacity_low=lambda: True)
    status = StatusWriter(SimpleNamespace(engine=engine, generation=1)).snapshot()
    (low,) = [c for c in status["conditions"] if c["type"] == "CapacityLow"]
    assert (low["status"], low["reason"]) == ("True", "AboveHighWatermark")
    assert low["message"] == "85% of 252.0Gi used (the model cache holds 24.0Mi)"
