"""What the worker reads into a NodeModelStore's status changes: the Events administrators see."""

from gpustack_models.reconcilers.store_events import transitions

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def store(entries, wanted=()):
    return {
        "metadata": {"name": "node-1", "uid": "u"},
        "spec": {"models": [{"digest": d} for d in wanted]},
        "status": {"models": entries},
    }


def entry(digest, state, **extra):
    return {"digest": digest, "state": state, "sizeBytes": 3 * 1024 * 1024, **extra}


def test_it_names_each_state_a_download_reaches():
    before = store([], [A])
    started = store([entry(A, "Downloading")], [A])
    ready = store([entry(A, "Ready")], [A])
    assert transitions(before, started) == [["Normal", "DownloadStarted", "downloading sha256:aaaaaaaaaaaa (3.0Mi)", A]]
    assert transitions(started, ready) == [["Normal", "DownloadReady", "sha256:aaaaaaaaaaaa (3.0Mi) is ready", A]]
    assert transitions(ready, ready) == []  # progress or nothing: no event


def test_it_gives_each_digest_and_reason_its_own_failure_series():
    failing = store([entry(A, "Failed", reason="HubUnavailable", message="503")], [A])
    (event,) = transitions(store([entry(A, "Downloading")], [A]), failing)
    assert event[:2] == ["Warning", "DownloadFailed"] and "HubUnavailable: 503" in event[2]
    assert event[3] == f"{A}/HubUnavailable"
    assert transitions(failing, failing) == []


def test_it_tells_collection_from_eviction():
    before = store([entry(A, "Ready"), entry(B, "Ready")], [A])
    after = store([], [A])
    events = {e[1]: e for e in transitions(before, after)}
    assert events["Evicted"][0] == "Warning" and "sha256:aaaaaaaaaaaa" in events["Evicted"][2]
    assert events["Collected"][0] == "Normal" and "sha256:bbbbbbbbbbbb" in events["Collected"][2]


def test_it_says_nothing_of_a_store_first_seen_or_deleted():
    full = store([entry(A, "Ready")], [A])
    assert transitions(None, full) == [] and transitions(full, None) == []
