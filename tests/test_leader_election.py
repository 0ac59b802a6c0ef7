"""Several replicas of the informers and of Celery beat: only the holder of the role's Lease acts.

Every replica here is a real process (``manage.py runinformers``, ``celery -A config beat``) with the
worker's ServiceAccount, against the session's kube-apiserver, each with its own file broker under its own
data directory and its own metrics port: what a replica sent to Celery is read back from its broker, so a
standby that sent anything, or a leader that sent an event twice, shows; its metrics count its tries of the
Lease, so a standby's own loop is seen running while it sends nothing. Leases are short here (4 s, renew
deadline 3 s, a try every 0.5 s).

The replicas the module needs are started together when it starts, on a few Leases of its own: a pool of
informers on one Lease (its tests take turns, each leaving a leader and standbys behind), two informers
with a long Lease (15 s) for the hand-over at SIGTERM and a standby with a long retry period to stop, one
informers standby for the intruder, two beats (ten processes; the module's tests used to start twelve, one
test at a time).
Timings are read from the Lease's own history (the ``renewTime`` and ``acquireTime`` the replicas wrote,
watched from kube-apiserver), not from when the test happened to look.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from gpustack_models import kube
from gpustack_models.kube.leases import ACQUIRED, HELD, LeaseElector, Timing, micro_time
from gpustack_models.kube.watch import WatchHandler, WatchTarget, watch_forever
from gpustack_models.local.cluster import free_port
from tests.support import wait_for
from tests.test_shutdown import RunQueue, create_artifact, spawn, tail

pytestmark = pytest.mark.django_db

LEASE, RENEW_DEADLINE, RETRY = 4.0, 3.0, 0.5
FAST = {
    "GPUSTACK_LEADER_LEASE_SECONDS": str(LEASE),
    "GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE),
    "GPUSTACK_LEADER_RETRY_SECONDS": str(RETRY),
}
SLOW = {"GPUSTACK_LEADER_LEASE_SECONDS": "15", "GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS": "10"}
SLOW_RETRY = 4.0  # the standby stopped at SIGTERM: a stop that waited for its next try shows
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{settings.NAMESPACE}/leases"
STORAGE = "/apis/worker.gpustack.ai/v1alpha1"
LOG_TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
LEADER_LINE = re.compile(LOG_TIME + r".*became leader of lease (\S+) as (\S+) after")
TRIES = "gpustack_models_leader_election_tries_total"
CHECKS = "gpustack_models.check_mounts"
SECRETS = "gpustack_models.check_resolution_secrets"


def log_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Replica:
    """One process of a role with its own data directory (its file broker), log and metrics port."""

    def __init__(self, argv: list[str], env: dict, root: Path):
        self.root = root
        root.mkdir(parents=True)
        self.log = root / "log"
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        env = dict(env, GPUSTACK_DATA_DIR=str(root), GPUSTACK_METRICS_ADDRESS="127.0.0.1")
        self.proc = spawn(argv, dict(env, GPUSTACK_METRICS_PORT=str(port)), self.log)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def leading(self) -> tuple[float, str] | None:
        """When (wall clock) and as whom it became leader, from its log line."""
        match = LEADER_LINE.search(self.text())
        if not match:
            assert self.alive(), f"exited with {self.proc.returncode}: {tail(self.log)}"
            return None
        return log_time(match.group(1)), match.group(3)

    def standing_by_since(self, holder: str) -> float | None:
        """When (wall clock) it first logged that ``holder`` holds its Lease."""
        match = re.search(LOG_TIME + rf".*standing by: lease \S+ held by {re.escape(holder)}$", self.text(), re.M)
        return log_time(match.group(1)) if match else None

    def sent(self) -> list[tuple[float, str]]:
        """(when written, task name and body) of every task message it sent."""
        found = []
        for path in (self.root / "celery" / "broker" / "queue").glob("*.msg"):
            try:
                message = json.loads(path.read_text())
                body = base64.b64decode(message["body"]).decode()
                found.append((path.stat().st_mtime, f"{message['headers']['task']} {body}"))
            except (OSError, ValueError):
                continue  # being written
        return sorted(found)

    def count(self, needle: str) -> int:
        return sum(needle in body for _, body in self.sent())

    def versions(self, name: str) -> list[str]:
        """The resourceVersion of every state of the object ``name`` it sent (one per event it passed on)."""
        found = []
        for _, body in self.sent():
            task, _, args = body.partition(" ")
            if task == "gpustack_models.mirror_events":
                entries = json.loads(args)[0][1]  # [[resource, entries], kwargs, embed]
                found += [
                    e[1]["metadata"].get("resourceVersion", "") for e in entries if e[1]["metadata"]["name"] == name
                ]
        return found

    def metric(self, name: str, **labels) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``, scraped from the process."""
        assert self.alive(), f"exited with {self.proc.returncode}: {tail(self.log)}"
        text = wait_for(self._scrape, timeout=30, message=f"its metrics port; log: {tail(self.log)}")
        wanted = set(labels.items())
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and wanted <= set(sample.labels.items())
        )

    def _scrape(self) -> str | None:
        try:
            return requests.get(self.metrics_url, timeout=5).text
        except requests.RequestException:
            return None

    def tries(self, outcome: str) -> float:
        """Its tries of its Lease that ended with ``outcome`` (``held``: it read the Lease held by another)."""
        return self.metric(TRIES, outcome=outcome)

    def wait_tries(self, outcome: str, count: float, timeout: float = 30) -> None:
        wait_for(
            lambda: self.tries(outcome) >= count,
            timeout=timeout,
            message=f"{count:.0f} tries ending {outcome}; log: {tail(self.log)}",
        )

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Fleet:
    """Starts replicas (``start``); kills every one at the end. The module's own groups are set by its
    fixture."""

    pool: Group
    pair: Group
    waiting: Replica
    waiting_lease: str
    watched: Replica
    watched_lease: str
    beats: Group

    def __init__(self, launcher, db_url: str, root: Path):
        self.base = dict(os.environ, KUBECONFIG=str(launcher.service_kubeconfig), DATABASE_URL=db_url) | FAST
        self.base.pop("CELERY_BROKER_URL", None)  # its own file broker: what it sent, read back
        self.base.pop("CELERY_RESULT_BACKEND", None)
        self.root = root
        self.started: list[Replica] = []

    def start(self, role: str, lease: str, **extra) -> Replica:
        env = self.base | extra
        home = self.root / f"{role}-{len(self.started)}"
        if role == "informers":
            argv, env["GPUSTACK_LEADER_INFORMERS_LEASE"] = [sys.executable, "manage.py", "runinformers"], lease
        else:
            argv = [sys.executable, "-m", "celery", "-A", "config", "beat", f"--schedule={home / 'schedule'}"]
            argv.append("--loglevel=INFO")
            env["GPUSTACK_LEADER_BEAT_LEASE"] = lease
        replica = Replica(argv, env, home)
        self.started.append(replica)
        return replica

    def kill_all(self) -> None:
        for replica in self.started:
            replica.kill()


class Group:
    """Replicas of one role on one Lease."""

    def __init__(self, lease: str, replicas: list[Replica]):
        self.lease, self.replicas = lease, replicas

    def leader(self, excluding: tuple[Replica, ...] = (), timeout: float = 60) -> tuple[Replica, float, str]:
        """The live replica that leads (waiting for one), when it became leader and as whom."""

        def find():
            for replica in self.replicas:
                if replica in excluding or not replica.alive():
                    continue
                if leading := replica.leading():
                    return replica, *leading
            return None

        return wait_for(find, timeout=timeout, message=f"a leader of {self.lease}")

    def standbys(self, holder: str) -> list[Replica]:
        """The live replicas that saw ``holder`` hold the Lease and never led (waiting for one)."""

        def find():
            return [
                r
                for r in self.replicas
                if r.alive() and f"held by {holder}" in r.text() and "became leader" not in r.text()
            ]

        return wait_for(find, timeout=60, message=f"a standby seeing {holder}")


def lease_name() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def hold(client, name: str, holder: str, seconds: int = 3600) -> None:
    """Create the Lease ``name`` held by ``holder`` for ``seconds`` (nobody renews it)."""
    now = micro_time()
    spec = {"holderIdentity": holder, "leaseDurationSeconds": seconds, "acquireTime": now, "renewTime": now}
    client.create(LEASES, {"metadata": {"name": name}, "spec": spec})


@pytest.fixture(scope="module")
def fleet(launcher, worker_kube, django_db_setup, django_db_blocker, tmp_path_factory):
    """Every long-lived replica of the module, started at once (see the module's docstring)."""
    from tests.support.worker import database_url

    with django_db_blocker.unblock():
        url = database_url()
    started = Fleet(launcher, url, tmp_path_factory.mktemp("leader-election"))
    pool, pair, waiting, watched, beats = (lease_name() for _ in range(5))
    hold(worker_kube, pair, "test-holder")  # released by its test: no one leads it before
    hold(worker_kube, waiting, "test-holder")  # never released
    hold(worker_kube, watched, "intruder")
    period = {"GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS": "1", "GPUSTACK_SECRET_CHECK_INTERVAL_SECONDS": "2"}
    try:
        started.pool = Group(pool, [started.start("informers", pool) for _ in range(4)])
        started.pair = Group(pair, [started.start("informers", pair, **SLOW) for _ in range(2)])
        started.waiting = started.start("informers", waiting, **SLOW, GPUSTACK_LEADER_RETRY_SECONDS=str(SLOW_RETRY))
        started.waiting_lease = waiting
        started.watched = started.start("informers", watched)
        started.watched_lease = watched
        started.beats = Group(beats, [started.start("beat", beats, **period) for _ in range(2)])
        yield started
    finally:
        started.kill_all()


@pytest.fixture(scope="module")
def admin_kube(cluster):
    """kube-apiserver as its administrator: the Lease's history is watched with it (the worker may only get,
    create and update Leases)."""
    return kube.Kube(kube.load_configuration(str(cluster.kubeconfig)))


def holder(client, name: str) -> str:
    return (client.get(f"{LEASES}/{name}").get("spec") or {}).get("holderIdentity") or ""


def wait_leader(replica: Replica, timeout: float = 30) -> tuple[float, str]:
    return wait_for(replica.leading, timeout=timeout, message=f"a leader; log: {tail(replica.log)}")


def wait_standing_by(replica: Replica, identity: str) -> float:
    return wait_for(
        lambda: replica.standing_by_since(identity),
        timeout=60,
        message=f"the standby to see {identity}; log: {tail(replica.log)}",
    )


def label(client, namespace: str, name: str, value: str) -> None:
    client.json(
        "PATCH",
        f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}",
        body={"metadata": {"labels": {"round": value}}},
        content_type="application/merge-patch+json",
    )


def micro(value: str) -> float:
    """A Kubernetes ``MicroTime`` as seconds since the epoch."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


class LeaseHistory(WatchHandler):
    """Every state of one Lease from now on, in order, as kube-apiserver stored it (a watch on a thread)."""

    def __init__(self, client, name: str):
        self.specs: list[dict] = []
        self.listed_once = threading.Event()
        self.stop = threading.Event()
        collection = WatchTarget(LEASES, field_selector=f"metadata.name={name}")
        self.thread = threading.Thread(target=watch_forever, args=(client, collection, self, self.stop), daemon=True)
        self.thread.start()
        assert self.listed_once.wait(30), "the Lease's watch did not list"

    def page(self, items: list[dict]) -> None:
        self.specs += [item.get("spec") or {} for item in items]

    def listed(self, resource_version: str, expired: bool) -> None:
        self.listed_once.set()

    def event(self, type_: str, obj: dict) -> None:
        self.specs.append(obj.get("spec") or {})

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)

    def held_by(self, identity: str) -> list[dict]:
        return [spec for spec in self.specs if spec.get("holderIdentity") == identity]

    def last_renewal(self, identity: str) -> float:
        """The ``renewTime`` of the last state ``identity`` wrote as holder."""
        return micro(self.held_by(identity)[-1]["renewTime"])

    def acquired(self, identity: str) -> float:
        """The ``acquireTime`` ``identity`` wrote when it took the Lease."""
        found = wait_for(lambda: self.held_by(identity), timeout=10, message=f"{identity} in the Lease's history")
        return micro(found[0]["acquireTime"])

    def handover(self, old: str, new: str) -> float:
        """Seconds from the last renewal by ``old`` to the acquisition by ``new``, as each wrote them."""
        acquired = self.acquired(new)  # the states before it came first: all are here
        return acquired - self.last_renewal(old)

    def after(self, identity: str) -> dict:
        """The state that followed the last one ``identity`` held."""
        last = max(i for i, spec in enumerate(self.specs) if spec.get("holderIdentity") == identity)
        return self.specs[last + 1]


# --- the informers ----------------------------------------------------------------------------------------


def test_one_informers_replica_acts_and_a_standby_relists_after_the_leader_is_killed(
    fleet, worker_kube, namespace, admin_kube
):
    first, _, first_id = fleet.pool.leader()
    standbys = fleet.pool.standbys(first_id)
    assert f"_{first.proc.pid}_" in first_id and holder(worker_kube, fleet.pool.lease) == first_id
    history = LeaseHistory(admin_kube, fleet.pool.lease)
    try:
        transitions = worker_kube.get(f"{LEASES}/{fleet.pool.lease}")["spec"]["leaseTransitions"]
        names = [f"seen-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        for name in names:
            create_artifact(worker_kube, namespace, name, "org/nowhere")
        wait_for(lambda: all(first.count(f'"{n}"') for n in names), timeout=30, message="the leader to send them")
        # In the same window the standbys' own loops ran (two more tries each, finding the Lease held), while
        # their informers saw no event and sent nothing.
        for standby in standbys:
            standby.wait_tries(HELD, standby.tries(HELD) + 2)
        # Each state once. Another part of the suite may be running a worker that resolves these artifacts (a
        # later MODIFIED of its own resourceVersion), so it is versions that must not repeat, not names.
        for name in names:
            versions = first.versions(name)
            assert versions and len(versions) == len(set(versions)), (name, versions)
        for standby in standbys:
            assert standby.sent() == [], "a standby sent tasks"
            assert standby.metric("gpustack_models_informer_events_total") == 0, "a standby watched"
            assert "became leader" not in standby.text()

        queue = RunQueue(standby.proc.pid for standby in standbys)
        first.kill()
        gap = f"gap-{uuid.uuid4().hex[:6]}"
        create_artifact(worker_kube, namespace, gap, "org/nowhere")  # while no one leads
        label(worker_kube, namespace, names[0], "while-no-one-leads")
        second, _, second_id = fleet.pool.leader(timeout=20)
        waited = queue.close()
        # Not before the record stayed unchanged for the Lease's duration, and within it plus one try (besides
        # the time the machine kept the standbys waiting for a CPU): from the leader's last renewal to the
        # standby's acquisition, as both wrote them.
        took = history.handover(first_id, second_id)
        print(f"informers: the standby led {took:.2f} s after the leader's last renewal ({waited:.2f} s for a CPU)")
        assert took >= LEASE and took - waited <= LEASE + 2 * RETRY + 1.0, (took, waited)
    finally:
        history.close()
    assert holder(worker_kube, fleet.pool.lease) == second_id and f"_{second.proc.pid}_" in second_id
    assert worker_kube.get(f"{LEASES}/{fleet.pool.lease}")["spec"]["leaseTransitions"] == transitions + 1
    # The new leader starts with a full list: the change made while no one led reaches Celery.
    wait_for(lambda: second.count(f'"{gap}"'), timeout=30, message="the gap's artifact in the new leader's relist")
    wait_for(lambda: second.count("while-no-one-leads"), timeout=30, message="the gap's change in the relist")


def test_sigterm_releases_the_lease_and_a_standby_takes_over_at_once(fleet, worker_kube, namespace, admin_kube):
    # A standby stops at once: not at its next try, SLOW_RETRY seconds after the one that saw a new holder
    # (its log line), while it waits.
    waiting = fleet.waiting
    wait_standing_by(waiting, "test-holder")
    spec = worker_kube.get(f"{LEASES}/{fleet.waiting_lease}")["spec"]
    overwrite(worker_kube, fleet.waiting_lease, dict(spec, holderIdentity="test-holder-2"))
    tried = wait_standing_by(waiting, "test-holder-2")
    queue = RunQueue([waiting.proc.pid])
    sent = time.time()
    waiting.proc.send_signal(signal.SIGTERM)
    assert waiting.proc.wait(2 * SLOW_RETRY) == 0, tail(waiting.log)
    exited, waited = time.time(), queue.close()
    print(f"informers: the standby exited {exited - sent:.2f} s after SIGTERM ({waited:.2f} s for a CPU)")
    assert exited - waited < tried + SLOW_RETRY, "the standby waited for its next try before stopping"
    took = exited - sent
    assert took - waited < 2.0, f"the standby stopped {took:.1f} s after SIGTERM ({waited:.1f} s for a CPU)"
    assert waiting.sent() == []

    lease = fleet.pair.lease  # held by the test until now; its replicas stand by

    for replica in fleet.pair.replicas:
        wait_standing_by(replica, "test-holder")
    history = LeaseHistory(admin_kube, lease)
    try:
        spec = worker_kube.get(f"{LEASES}/{lease}")["spec"]
        now = micro_time()
        overwrite(worker_kube, lease, dict(spec, holderIdentity="", leaseDurationSeconds=1, renewTime=now))
        first, _, first_id = fleet.pair.leader()
        (second,) = fleet.pair.standbys(first_id)
        queue = RunQueue([second.proc.pid])
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(10) == 0, tail(first.log)
        assert "released lease" in first.text()
        _, second_id = wait_leader(second, timeout=20)
        waited = queue.close()
        # From the release (the record the leader wrote as it stopped) to the standby's acquisition: at its
        # next try, not after the 15 s Lease.
        acquired = history.acquired(second_id)
        released = history.after(first_id)
        assert released["holderIdentity"] == "", released
        took = acquired - micro(released["renewTime"])
        print(f"informers: the standby led {took:.2f} s after the leader released the Lease ({waited:.2f} s for a CPU)")
        assert took - waited < 4.0, f"took {took:.1f} s with a 15 s Lease ({waited:.1f} s waiting for a CPU)"
    finally:
        history.close()
    assert holder(worker_kube, lease) == second_id
    name = f"after-{uuid.uuid4().hex[:6]}"
    create_artifact(worker_kube, namespace, name, "org/nowhere")
    wait_for(lambda: second.count(f'"{name}"'), timeout=30, message="the new leader to send the event")


def test_a_leader_whose_lease_was_taken_stops_and_exits_non_zero(fleet, worker_kube):
    first, _, _ = fleet.pool.leader()
    spec = worker_kube.get(f"{LEASES}/{fleet.pool.lease}")["spec"]
    overwrite(worker_kube, fleet.pool.lease, dict(spec, holderIdentity="usurper", renewTime=micro_time()))
    assert first.proc.wait(15) == 1, tail(first.log)
    assert "lost lease" in first.text() and "taken by usurper" in first.text()
    spec = worker_kube.get(f"{LEASES}/{fleet.pool.lease}")["spec"]
    overwrite(worker_kube, fleet.pool.lease, dict(spec, holderIdentity=""))  # the usurper leaves: a standby leads


def test_a_frozen_leader_that_was_replaced_exits_when_it_resumes(fleet, worker_kube):
    first, _, first_id = fleet.pool.leader()
    fleet.pool.standbys(first_id)
    os.killpg(first.proc.pid, signal.SIGSTOP)
    try:
        _, _, second_id = fleet.pool.leader(excluding=(first,), timeout=20)
    finally:
        os.killpg(first.proc.pid, signal.SIGCONT)
    assert first.proc.wait(15) == 1, tail(first.log)
    assert f"taken by {second_id}" in first.text()
    assert holder(worker_kube, fleet.pool.lease) == second_id


class Recorded:
    """The tries of an elector: (start, end, whether it held the Lease after), each as it ran."""

    def __init__(self, elector: LeaseElector):
        self.tries: list[tuple[float, float, bool]] = []
        self.first_seen: float | None = None  # when the elector first read the record (its own clock)
        real = elector.try_acquire_or_renew

        def recorded() -> bool:
            started = time.monotonic()
            held = real()
            if self.first_seen is None:
                self.first_seen = elector._observed_at
            self.tries.append((started, time.monotonic(), held))
            return held

        elector.try_acquire_or_renew = recorded


def test_a_leader_that_cannot_reach_kube_apiserver_loses_the_lease_at_the_renew_deadline(worker_kube):
    name = lease_name()
    elector = LeaseElector(worker_kube, settings.NAMESPACE, name, Timing(LEASE, RENEW_DEADLINE, RETRY))
    assert elector.acquire(threading.Event())
    renewed = elector._last_renewal  # its own clock's time of its last renewal
    elector.client = kube.Kube(worker_kube.credentials)
    elector.client.host = f"https://127.0.0.1:{free_port()}"  # nothing listens: every renewal fails
    recorded = Recorded(elector)
    assert elector.keep(threading.Event()) is True
    lost = time.monotonic()
    tries = recorded.tries
    assert len(tries) >= 2 and not any(held for _, _, held in tries), tries
    # Lost at the first failed try past the deadline: not before it, and no try later than needed.
    assert lost - renewed >= RENEW_DEADLINE, lost - renewed
    assert tries[-2][1] - renewed < RENEW_DEADLINE, [end - renewed for _, end, _ in tries]
    assert not elector.leading
    assert holder(worker_kube, name) == elector.identity  # still named, but expiring: a standby takes it


# --- attacks on the Lease ------------------------------------------------------------------------------------


def overwrite(client, name: str, spec: dict) -> None:
    """Take the Lease over from its holder, whatever it says (reading again after a 409 Conflict)."""
    for _ in range(10):
        current = client.get(f"{LEASES}/{name}")
        current["spec"] = spec
        try:
            client.json("PUT", f"{LEASES}/{name}", body=current)
            return
        except kube.Conflict:
            continue
    raise AssertionError(f"could not overwrite lease {name}")


class Renewer:
    """Someone else holding a Lease and renewing it every retry period (the test itself)."""

    def __init__(self, client, name: str):
        self.client, self.name, self.stop = client, name, threading.Event()
        now = micro_time()
        spec = {"holderIdentity": "intruder", "leaseDurationSeconds": int(LEASE), "acquireTime": now, "renewTime": now}
        try:
            client.create(LEASES, {"metadata": {"name": name}, "spec": spec})
        except kube.AlreadyExists:
            overwrite(client, name, spec)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(RETRY):
            current = self.client.get(f"{LEASES}/{self.name}")
            current["spec"]["renewTime"] = micro_time()
            self.client.json("PUT", f"{LEASES}/{self.name}", body=current)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def test_a_lease_someone_keeps_renewing_is_never_taken(fleet, worker_kube, admin_kube):
    lease, standby = fleet.watched_lease, fleet.watched
    wait_standing_by(standby, "intruder")
    history = LeaseHistory(admin_kube, lease)
    try:
        intruder = Renewer(worker_kube, lease)
        try:
            # Three Lease durations of the standby's own tries (each at least a retry period after the last),
            # every one finding the Lease held while the intruder renewed it.
            start = standby.tries(HELD)
            standby.wait_tries(HELD, start + 3 * LEASE / RETRY + 1, timeout=60)
            assert standby.leading() is None and standby.tries(ACQUIRED) == 0
            assert holder(worker_kube, lease) == "intruder"
            assert standby.sent() == []
        finally:
            queue = RunQueue([standby.proc.pid])
            intruder.close()
        renewals = [micro(s["renewTime"]) for s in history.held_by("intruder") if s["leaseDurationSeconds"] == LEASE]
        gaps = [b - a for a, b in zip(renewals, renewals[1:], strict=False)]
        assert len(renewals) >= 3 * LEASE / RETRY / 2 and max(gaps) < LEASE, gaps  # it did keep renewing
        # The intruder stops renewing: the standby takes over after the Lease's duration.
        _, standby_id = wait_leader(standby, timeout=20)
        waited = queue.close()
        took = history.handover("intruder", standby_id)
        assert took >= LEASE and took - waited <= LEASE + 2 * RETRY + 1.0, (took, waited)
    finally:
        history.close()


@pytest.mark.parametrize(
    "spec, at_once",
    [
        ({"holderIdentity": ""}, True),  # no holder and no duration: free (a released Lease reads so)
        (None, True),  # no spec at all
        ({"holderIdentity": "ghost"}, False),  # a holder without a duration: the default duration applies
        ({"holderIdentity": "ghost", "renewTime": "2099-01-01T00:00:00.000000Z"}, False),  # a clock far ahead
    ],
)
def test_a_garbage_lease_does_not_crash_the_elector(worker_kube, spec, at_once):
    name = lease_name()
    body = {"metadata": {"name": name}}
    if spec is not None:
        body["spec"] = spec
    worker_kube.create(LEASES, body)
    elector = LeaseElector(worker_kube, settings.NAMESPACE, name, Timing(LEASE, RENEW_DEADLINE, RETRY))
    recorded = Recorded(elector)
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)
    timer.start()
    try:
        assert elector.acquire(stop)
    finally:
        timer.cancel()
    tries = recorded.tries
    assert [held for _, _, held in tries] == [False] * (len(tries) - 1) + [True], tries
    if at_once:
        assert len(tries) == 1, tries
    else:
        # Taken once unchanged for the default duration (the elector's clock, from its first read), at the
        # first try after it: the try before began within the duration.
        assert len(tries) >= 2, tries
        assert tries[-1][1] - recorded.first_seen > LEASE, [end - recorded.first_seen for _, end, _ in tries]
        assert tries[-2][0] - recorded.first_seen <= LEASE, [start - recorded.first_seen for start, _, _ in tries]
    written = worker_kube.get(f"{LEASES}/{name}")["spec"]
    assert written["holderIdentity"] == elector.identity and written["leaseDurationSeconds"] == int(LEASE)
    elector.release()
    assert worker_kube.get(f"{LEASES}/{name}")["spec"]["holderIdentity"] in ("", None)


def test_candidates_racing_for_one_lease_get_one_leader(worker_kube):
    """Writes at the resourceVersion read: of eight candidates trying at once, exactly one wins."""
    name = lease_name()
    worker_kube.create(LEASES, {"metadata": {"name": name}, "spec": {"holderIdentity": ""}})
    timing = Timing(LEASE, RENEW_DEADLINE, RETRY)
    clients = [kube.Kube(worker_kube.credentials) for _ in range(8)]
    electors = [LeaseElector(c, settings.NAMESPACE, name, timing) for c in clients]
    barrier = threading.Barrier(len(electors))
    won: list[str] = []

    def race(elector):
        barrier.wait()
        if elector.try_acquire_or_renew():
            won.append(elector.identity)

    threads = [threading.Thread(target=race, args=(e,)) for e in electors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(won) == 1, won
    assert holder(worker_kube, name) == won[0]


# --- Celery beat --------------------------------------------------------------------------------------------


def test_one_beat_replica_sends_and_a_standby_takes_over_without_a_burst(fleet, worker_kube, admin_kube):
    first, _, first_id = fleet.beats.leader()
    (second,) = fleet.beats.standbys(first_id)
    wait_for(lambda: first.count(CHECKS) >= 2, timeout=30, message=f"the leader to send; log: {tail(first.log)}")
    # Eight periods of the mount check (1 s), as the leader's broker stamped them: once a period, six to ten
    # in eight seconds (besides the time the machine kept beat waiting for a CPU).
    before = first.count(CHECKS)
    queue = RunQueue([first.proc.pid])
    wait_for(lambda: first.count(CHECKS) >= before + 8, timeout=60, message="eight more mount checks")
    waited = queue.close()
    sent = [when for when, body in first.sent() if body.startswith(CHECKS)][before - 1 : before + 8]
    span = sent[-1] - sent[0]
    print(f"beat: 8 mount checks (1 s period) in {span:.2f} s ({waited:.2f} s for a CPU)")
    assert span >= 8 * 0.8 and span - waited <= 8 * 8 / 6, (span, waited)
    assert second.sent() == [], "the standby beat sent tasks"

    history = LeaseHistory(admin_kube, fleet.beats.lease)
    try:
        queue = RunQueue([second.proc.pid])
        first.kill()
        took_over, second_id = wait_leader(second, timeout=20)
        waited = queue.close()
        took = history.handover(first_id, second_id)
        print(f"beat: the standby led {took:.2f} s after the leader's last renewal ({waited:.2f} s for a CPU)")
        assert took >= LEASE and took - waited <= LEASE + 2 * RETRY + 1.0, (took, waited)
    finally:
        history.close()
    wait_for(lambda: second.count(CHECKS) >= 4, timeout=30, message=f"the new leader to send; {tail(second.log)}")
    # No burst for the time it stood by (each task had been due for seconds): the first of each task one
    # period after the takeover (its log line; the mtime of the message, less a tick of the file clock).
    first_sent = {body.split()[0]: when for when, body in reversed(second.sent())}
    delays = {task: round(when - took_over, 3) for task, when in first_sent.items()}
    print(f"beat: the new leader's first task of each kind, seconds after it led: {delays}")
    assert first_sent[CHECKS] - took_over >= 1.0 - 0.01, delays
    assert first_sent.get(SECRETS, took_over + 2) - took_over >= 2.0 - 0.01, delays
    assert set(first_sent) <= {CHECKS, SECRETS}, first_sent


def test_beat_stops_sending_while_its_lease_is_taken_and_resumes_when_it_is_free(fleet, worker_kube):
    beat, _, _ = fleet.beats.leader()
    terms, losses = len(LEADER_LINE.findall(beat.text())), beat.text().count("lost lease")
    sending = beat.count(CHECKS)
    wait_for(lambda: beat.count(CHECKS) >= sending + 2, timeout=30, message="beat to send")
    intruder = Renewer(worker_kube, fleet.beats.lease)
    try:
        wait_for(
            lambda: beat.text().count("lost lease") > losses, timeout=15, message=f"beat to lose it; {tail(beat.log)}"
        )
        # Two of its tries after the loss (a tick already under way ends meanwhile), then ten more, each
        # finding the Lease held: five seconds of its own loop, five periods of the mount check, nothing sent.
        held = beat.tries(HELD)
        beat.wait_tries(HELD, held + 2)
        during = beat.count(CHECKS)
        beat.wait_tries(HELD, held + 12)
        assert beat.count(CHECKS) == during, "beat sent tasks while another held its Lease"
        assert beat.alive()
    finally:
        intruder.close()
    wait_for(lambda: len(LEADER_LINE.findall(beat.text())) > terms, timeout=20, message="beat to lead again")
    wait_for(lambda: beat.count(CHECKS) >= during + 2, timeout=20, message="beat to send again")
