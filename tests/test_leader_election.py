"""Several replicas of the informers and of Celery beat: only the holder of the role's Lease acts.

Every replica here is a real process (``manage.py runinformers``, ``celery -A config beat``) with the
worker's ServiceAccount, against the session's kube-apiserver, each with its own file broker under its own
data directory: what a replica sent to Celery is read back from its broker, so a standby that sent
anything, or a leader that sent an event twice, shows. Leases are short here (4 s, renew deadline 3 s, a
try every 0.5 s) and each test has its own Lease names.
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
from datetime import datetime
from pathlib import Path

import pytest
from django.conf import settings

from gpustack_models import kube
from gpustack_models.kube.leases import LeaseElector, Timing, micro_time
from tests.support import wait_for
from tests.test_shutdown import create_artifact, spawn, tail

pytestmark = pytest.mark.django_db

LEASE, RENEW_DEADLINE, RETRY = 4.0, 3.0, 0.5
FAST = {
    "GPUSTACK_LEADER_LEASE_SECONDS": str(LEASE),
    "GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE),
    "GPUSTACK_LEADER_RETRY_SECONDS": str(RETRY),
}
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{settings.NAMESPACE}/leases"
STORAGE = "/apis/worker.gpustack.ai/v1alpha1"
LEADER_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*became leader of lease (\S+) as (\S+) after")


class Replica:
    """One process of a role with its own data directory (its file broker) and log."""

    def __init__(self, argv: list[str], env: dict, root: Path):
        self.root = root
        root.mkdir(parents=True)
        self.log = root / "log"
        self.proc = spawn(argv, dict(env, GPUSTACK_DATA_DIR=str(root)), self.log)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def leading(self) -> tuple[float, str] | None:
        """When (wall clock) and as whom it became leader, from its log line."""
        match = LEADER_LINE.search(self.text())
        if not match:
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}: {tail(self.log)}"
            return None
        return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), match.group(3)

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

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def replicas(launcher, db_url_env):
    """Start replicas with ``start(role, lease, **env)``; every one is killed after the test."""
    started: list[Replica] = []

    def start(role: str, root: Path, lease: str, **extra) -> Replica:
        env = dict(os.environ, KUBECONFIG=str(launcher.worker_kubeconfig), **db_url_env) | FAST | extra
        env.pop("CELERY_BROKER_URL", None)  # its own file broker: what it sent, read back
        env.pop("CELERY_RESULT_BACKEND", None)
        home = root / f"{role}-{len(started)}"
        if role == "informers":
            argv, env["GPUSTACK_LEADER_INFORMERS_LEASE"] = [sys.executable, "manage.py", "runinformers"], lease
        else:
            argv = [sys.executable, "-m", "celery", "-A", "config", "beat", f"--schedule={home / 'schedule'}"]
            argv.append("--loglevel=INFO")
            env["GPUSTACK_LEADER_BEAT_LEASE"] = lease
        replica = Replica(argv, env, home)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.kill()


@pytest.fixture
def db_url_env(django_db_setup, django_db_blocker):
    from tests.support.worker import database_url

    with django_db_blocker.unblock():
        return {"DATABASE_URL": database_url()}


def lease_name() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def holder(client, name: str) -> str:
    return (client.get(f"{LEASES}/{name}").get("spec") or {}).get("holderIdentity") or ""


def wait_leader(replica: Replica, timeout: float = 30) -> tuple[float, str]:
    return wait_for(replica.leading, timeout=timeout, message=f"a leader; log: {tail(replica.log)}")


def wait_standing_by(replica: Replica, identity: str) -> None:
    wait_for(
        lambda: f"held by {identity}" in replica.text(),
        timeout=30,
        message=f"the standby to see {identity}; log: {tail(replica.log)}",
    )


def label(client, namespace: str, name: str, value: str) -> None:
    client.json(
        "PATCH",
        f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}",
        body={"metadata": {"labels": {"round": value}}},
        content_type="application/merge-patch+json",
    )


# --- the informers ----------------------------------------------------------------------------------------


def test_one_informers_replica_acts_and_a_standby_relists_after_the_leader_is_killed(
    replicas, worker_kube, namespace, tmp_path
):
    lease = lease_name()
    first = replicas("informers", tmp_path, lease)
    _, first_id = wait_leader(first)
    second = replicas("informers", tmp_path, lease)
    wait_standing_by(second, first_id)
    assert f"_{first.proc.pid}_" in first_id and holder(worker_kube, lease) == first_id
    names = [f"seen-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    for name in names:
        create_artifact(worker_kube, namespace, name, "org/nowhere")
    wait_for(lambda: all(first.count(f'"{n}"') for n in names), timeout=30, message="the leader to send the events")
    time.sleep(2 * RETRY)  # a standby that watched would have sent them by now, as the leader did
    # Each state once. Another part of the suite may be running a worker that resolves these artifacts (a
    # later MODIFIED of its own resourceVersion), so it is versions that must not repeat, not names.
    for name in names:
        versions = first.versions(name)
        assert versions and len(versions) == len(set(versions)), (name, versions)
    assert second.sent() == [], "the standby sent tasks"
    assert "became leader" not in second.text()

    first.kill()
    killed = time.time()
    gap = f"gap-{uuid.uuid4().hex[:6]}"
    create_artifact(worker_kube, namespace, gap, "org/nowhere")  # while no one leads
    label(worker_kube, namespace, names[0], "while-no-one-leads")
    took_over, second_id = wait_leader(second, timeout=20)
    # Not before the record stayed unchanged for the Lease's duration (the leader renewed at most a retry
    # period before its death), and within it plus one try.
    print(f"informers: the standby led {took_over - killed:.2f} s after the leader was killed")  # shown with -s
    assert LEASE - RETRY - 0.5 <= took_over - killed <= LEASE + 2 * RETRY + 1.0, took_over - killed
    assert holder(worker_kube, lease) == second_id and f"_{second.proc.pid}_" in second_id
    assert worker_kube.get(f"{LEASES}/{lease}")["spec"]["leaseTransitions"] == 1
    # The new leader starts with a full list: the change made while no one led reaches Celery.
    wait_for(lambda: second.count(f'"{gap}"'), timeout=30, message="the gap's artifact in the new leader's relist")
    wait_for(lambda: second.count("while-no-one-leads"), timeout=30, message="the gap's change in the relist")


def test_sigterm_releases_the_lease_and_a_standby_takes_over_at_once(replicas, worker_kube, namespace, tmp_path):
    lease = lease_name()
    slow = {"GPUSTACK_LEADER_LEASE_SECONDS": "15", "GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS": "10"}
    first = replicas("informers", tmp_path, lease, **slow)
    _, first_id = wait_leader(first)
    second = replicas("informers", tmp_path, lease, **slow)
    third = replicas("informers", tmp_path, lease, **slow)
    wait_standing_by(second, first_id)
    wait_standing_by(third, first_id)

    # A standby stops at once.
    sent = time.monotonic()
    third.proc.send_signal(signal.SIGTERM)
    assert third.proc.wait(10) == 0
    assert time.monotonic() - sent < 2.0, time.monotonic() - sent
    assert third.sent() == []

    sent_at = time.time()
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(10) == 0, tail(first.log)
    assert "released lease" in first.text()
    took_over, second_id = wait_leader(second, timeout=20)
    print(f"informers: the standby led {took_over - sent_at:.2f} s after SIGTERM to the leader (15 s Lease)")
    assert took_over - sent_at < 4.0, f"took {took_over - sent_at:.1f} s with a 15 s Lease"
    assert holder(worker_kube, lease) == second_id
    name = f"after-{uuid.uuid4().hex[:6]}"
    create_artifact(worker_kube, namespace, name, "org/nowhere")
    wait_for(lambda: second.count(f'"{name}"'), timeout=30, message="the new leader to send the event")


def test_a_leader_whose_lease_was_taken_stops_and_exits_non_zero(replicas, worker_kube, tmp_path):
    lease = lease_name()
    first = replicas("informers", tmp_path, lease)
    _, first_id = wait_leader(first)
    spec = worker_kube.get(f"{LEASES}/{lease}")["spec"]
    overwrite(worker_kube, lease, dict(spec, holderIdentity="usurper", renewTime=micro_time()))
    assert first.proc.wait(15) == 1, tail(first.log)
    assert "lost lease" in first.text() and "taken by usurper" in first.text()


def test_a_frozen_leader_that_was_replaced_exits_when_it_resumes(replicas, worker_kube, tmp_path):
    lease = lease_name()
    first = replicas("informers", tmp_path, lease)
    _, first_id = wait_leader(first)
    second = replicas("informers", tmp_path, lease)
    wait_standing_by(second, first_id)
    os.killpg(first.proc.pid, signal.SIGSTOP)
    try:
        _, second_id = wait_leader(second, timeout=20)
    finally:
        os.killpg(first.proc.pid, signal.SIGCONT)
    assert first.proc.wait(15) == 1, tail(first.log)
    assert f"taken by {second_id}" in first.text()
    assert holder(worker_kube, lease) == second_id


def test_a_leader_that_cannot_reach_kube_apiserver_loses_the_lease_at_the_renew_deadline(worker_kube):
    from gpustack_models.local.cluster import free_port

    name = lease_name()
    elector = LeaseElector(worker_kube, settings.NAMESPACE, name, Timing(LEASE, RENEW_DEADLINE, RETRY))
    assert elector.acquire(threading.Event())
    elector.client = kube.Kube(worker_kube.configuration)
    elector.client.host = f"https://127.0.0.1:{free_port()}"  # nothing listens: every renewal fails
    started = time.monotonic()
    assert elector.keep(threading.Event()) is True
    took = time.monotonic() - started
    assert RENEW_DEADLINE - 0.5 <= took <= RENEW_DEADLINE + 2 * RETRY + 0.5, took
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
    """Someone else holding a Lease and renewing it every second (the test itself)."""

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
        while not self.stop.wait(1.0):
            current = self.client.get(f"{LEASES}/{self.name}")
            current["spec"]["renewTime"] = micro_time()
            self.client.json("PUT", f"{LEASES}/{self.name}", body=current)


def test_a_lease_someone_keeps_renewing_is_never_taken(replicas, worker_kube, tmp_path):
    lease = lease_name()
    intruder = Renewer(worker_kube, lease)
    try:
        standby = replicas("informers", tmp_path, lease)
        wait_standing_by(standby, "intruder")
        time.sleep(3 * LEASE)  # three Lease durations of renewals by the intruder
        assert standby.leading() is None
        assert holder(worker_kube, lease) == "intruder"
        assert standby.sent() == []
    finally:
        intruder.stop.set()
        intruder.thread.join(5)
    stopped = time.time()  # the intruder stops renewing: the standby takes over after the Lease's duration
    took_over, _ = wait_leader(standby, timeout=20)
    assert LEASE - 1.5 <= took_over - stopped <= LEASE + 2 * RETRY + 1.0, took_over - stopped


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
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        assert elector.acquire(stop)
    finally:
        timer.cancel()
    took = time.monotonic() - started
    assert (took < 2.0) if at_once else (LEASE <= took <= LEASE + 2 * RETRY + 1.0), took
    written = worker_kube.get(f"{LEASES}/{name}")["spec"]
    assert written["holderIdentity"] == elector.identity and written["leaseDurationSeconds"] == int(LEASE)
    elector.release()
    assert worker_kube.get(f"{LEASES}/{name}")["spec"]["holderIdentity"] in ("", None)


def test_candidates_racing_for_one_lease_get_one_leader(worker_kube):
    """Writes at the resourceVersion read: of eight candidates trying at once, exactly one wins."""
    name = lease_name()
    worker_kube.create(LEASES, {"metadata": {"name": name}, "spec": {"holderIdentity": ""}})
    timing = Timing(LEASE, RENEW_DEADLINE, RETRY)
    clients = [kube.Kube(worker_kube.configuration) for _ in range(8)]
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


CHECKS = "gpustack_models.check_mounts"


def test_one_beat_replica_sends_and_a_standby_takes_over_without_a_burst(replicas, tmp_path):
    lease = lease_name()
    period = {"GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS": "1", "GPUSTACK_SECRET_CHECK_INTERVAL_SECONDS": "2"}
    first = replicas("beat", tmp_path, lease, **period)
    _, first_id = wait_leader(first)
    second = replicas("beat", tmp_path, lease, **period)
    wait_standing_by(second, first_id)
    wait_for(lambda: first.count(CHECKS) >= 2, timeout=30, message=f"the leader to send; log: {tail(first.log)}")
    before = first.count(CHECKS)
    time.sleep(8.0)  # eight periods of the mount check
    ran = first.count(CHECKS) - before
    print(f"beat: {ran} mount checks in 8 s (1 s period) from two replicas")
    assert 6 <= ran <= 10, f"{ran} mount checks in 8 s with a 1 s period"
    assert second.sent() == [], "the standby beat sent tasks"

    first.kill()
    killed = time.time()
    took_over, _ = wait_leader(second, timeout=20)
    print(f"beat: the standby led {took_over - killed:.2f} s after the leader was killed")
    assert took_over - killed <= LEASE + 2 * RETRY + 1.0, took_over - killed
    wait_for(lambda: second.count(CHECKS) >= 4, timeout=30, message=f"the new leader to send; {tail(second.log)}")
    # No burst for the time it stood by (each task had been due for seconds): the first of each task one
    # period after the takeover.
    first_sent = {body.split()[0]: when for when, body in reversed(second.sent())}
    delays = {task: round(when - took_over, 2) for task, when in first_sent.items()}
    print(f"beat: the new leader's first task of each kind, seconds after it led: {delays}")
    assert first_sent[CHECKS] - took_over >= 0.8, first_sent
    assert first_sent.get("gpustack_models.check_resolution_secrets", took_over + 2) - took_over >= 1.8, first_sent
    assert set(first_sent) <= {CHECKS, "gpustack_models.check_resolution_secrets"}, first_sent


def test_beat_stops_sending_while_its_lease_is_taken_and_resumes_when_it_is_free(replicas, worker_kube, tmp_path):
    lease = lease_name()
    beat = replicas("beat", tmp_path, lease, GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS="1")
    wait_leader(beat)
    wait_for(lambda: beat.count(CHECKS) >= 2, timeout=30, message="beat to send")
    intruder = Renewer(worker_kube, lease)
    try:
        wait_for(lambda: "lost lease" in beat.text(), timeout=15, message=f"beat to lose it; {tail(beat.log)}")
        time.sleep(RETRY * 2)  # a tick already under way
        during = beat.count(CHECKS)
        time.sleep(5.0)
        assert beat.count(CHECKS) == during, "beat sent tasks while another held its Lease"
        assert beat.proc.poll() is None
    finally:
        intruder.stop.set()
        intruder.thread.join(5)
    wait_for(lambda: len(LEADER_LINE.findall(beat.text())) >= 2, timeout=20, message="beat to lead again")
    wait_for(lambda: beat.count(CHECKS) >= during + 2, timeout=20, message="beat to send again")
