"""The faults the chaos run injects, one at a time: each ``inject_<kind>`` breaks something and returns how to
mend it (what the cluster's own machinery would do: a kubelet starting a killed container again, an
operator freeing a disk, the hub coming back)."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from django.conf import settings

from gpustack_models import kube
from tests.chaos.chaos_stack import CLOCK_NODE, DISK_NODE, ChaosStack
from tests.chaos.workload import MiB, Workload
from tests.support.waiting import wait_for

KINDS = (
    "kill", "kill-leader", "kube-apiserver", "compaction", "redis", "postgres", "hub-5xx", "hub-429",
    "hub-stall", "hub-reset", "hub-corrupt", "peer-killed", "disk-full", "clock-jump",
)  # fmt: skip
HUB_KINDS = {kind for kind in KINDS if kind.startswith("hub-")}
HIGH_PERCENT = 80  # GPUSTACK_STORE_HIGH_PERCENT's default: the volume's high watermark


@dataclass
class Injected:
    kind: str
    detail: str
    mend: Callable[[], None] = field(default=lambda: None)
    hub_fault: object = None  # a hub fault: how many answers it changed (``hits``) is reported
    problem: bool = False  # the fault did not do what it is for (reported with the round's problems)

    @property
    def bit(self) -> bool:
        """Whether the fault did anything yet (a hub fault changes nothing until a request comes)."""
        return self.hub_fault is None or self.hub_fault.hits > 0

    def outcome(self) -> str:
        return self.detail if self.hub_fault is None else f"{self.detail}: {self.hub_fault.hits} answers"


class Injector:
    def __init__(self, stack: ChaosStack, workload: Workload, rng: random.Random):
        self.stack, self.workload, self.rng = stack, workload, rng
        self.hub = stack.hub

    def inject(self, kind: str) -> Injected:
        return getattr(self, "inject_" + kind.replace("-", "_"))()

    # --- processes --------------------------------------------------------------------------------------------
    def inject_kill(self) -> Injected:
        victim = self.rng.choice(list(self.stack.roles.values()) + self.stack.plugins)
        pid = victim.pid
        victim.kill()
        return Injected("kill", f"kill -9 {victim.name} (pid {pid})", self._restart(victim))

    def inject_kill_leader(self) -> Injected:
        lease = self.rng.choice(["chaos-informers", "chaos-beat"])
        holder = self._holder(lease)
        role = next((r for r in self.stack.roles.values() if f"_{r.pid}_" in holder), None)
        if role is None:
            return Injected("kill-leader", f"no holder of {lease} among the roles ({holder!r}): nothing killed")
        role.kill()
        return Injected("kill-leader", f"kill -9 {role.name}, leader of {lease}", self._restart(role))

    def _holder(self, lease: str) -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.NAMESPACE}/leases/{lease}"
        try:
            return (self.stack.launcher.admin.get(path).get("spec") or {}).get("holderIdentity") or ""
        except kube.StatusError:
            return ""

    @staticmethod
    def _restart(victim) -> Callable[[], None]:
        return lambda: victim.start_again() if hasattr(victim, "start_again") else victim.start()

    # --- the control plane and the datastores -------------------------------------------------------------------
    def inject_kube_apiserver(self) -> Injected:
        self.stack.cluster.restart_apiserver()
        return Injected("kube-apiserver", "kube-apiserver stopped and started again")

    def inject_compaction(self) -> Injected:
        """etcd compacted at its newest revision, then kube-apiserver restarted: its new watch cache starts
        past every resourceVersion the informers hold, so each watch they resume is answered 410 Expired."""
        before = self._relists()
        revision = self.stack.cluster.compact_etcd()
        self.stack.cluster.restart_apiserver()
        # What the fault is for: the informers list again, told 410 Expired where they resume a watch (or, when
        # the restart outlasted their leader's renew deadline, as the next leader lists afresh).
        try:
            wait_for(lambda: self._relists()[0] > before[0], timeout=60, message="the informers to list again")
        except AssertionError:
            return Injected("compaction", f"etcd compacted at {revision}: NO RELIST SEEN", problem=True)
        relists, expired = (now - then for now, then in zip(self._relists(), before, strict=True))
        return Injected("compaction", f"etcd compacted at revision {revision}, kube-apiserver restarted: "
                        f"{relists} informer relists, {expired} after 410 Expired")  # fmt: skip

    def _relists(self) -> tuple[int, int]:
        """The informers' relists, and those after 410 Expired, as the mirror records them."""
        query = "SELECT coalesce(sum(relists), 0), coalesce(sum(expired), 0) FROM gpustack_models_informerstate"
        try:
            with psycopg.connect(self.stack.database_url, connect_timeout=5) as conn:
                relists, expired = conn.execute(query).fetchone()
                return int(relists), int(expired)
        except psycopg.OperationalError:
            return -1, -1

    def inject_redis(self) -> Injected:
        self.stack.redis.stop()
        return Injected("redis", "Redis stopped (its queue lost: it persists nothing)", self.stack.redis.start)

    def inject_postgres(self) -> Injected:
        self.stack.postgres.halt()
        return Injected("postgres", "PostgreSQL stopped (fast shutdown)", self.stack.postgres.serve)

    # --- the hub ------------------------------------------------------------------------------------------------
    def inject_hub_5xx(self) -> Injected:
        fault = self.hub.faults.fail(None, self.rng.choice([500, 502, 503]), times=None)
        return Injected("hub-5xx", "every hub request answered 5xx", self.hub.faults.clear, fault)

    def inject_hub_429(self) -> Injected:
        fault = self.hub.faults.fail(None, 429, retry_after=2, times=None)
        return Injected("hub-429", "every hub request answered 429 (Retry-After: 2)", self.hub.faults.clear, fault)

    def inject_hub_stall(self) -> Injected:
        fault = self.hub.faults.stall(None, after_bytes=256 * 1024, seconds=45, times=None)
        return Injected("hub-stall", "file bodies stall after 256 KiB for 45 s", self.hub.faults.clear, fault)

    def inject_hub_reset(self) -> Injected:
        fault = self.hub.faults.drop(None, after_bytes=self.rng.randint(1, 2 * 1024 * 1024), times=None)
        return Injected("hub-reset", "file bodies cut by a closed connection", self.hub.faults.clear, fault)

    def inject_hub_corrupt(self) -> Injected:
        fault = self.hub.faults.corrupt(None, times=None)
        return Injected("hub-corrupt", "one byte of every file body flipped", self.hub.faults.clear, fault)

    # --- nodes ------------------------------------------------------------------------------------------------
    def inject_peer_killed(self) -> Injected:
        """A node that holds a model killed while another copies it from that node: the hub holds the model's
        bodies, so the copy can only come from the peer, whose serving rate is capped (``PEER_RATE``)."""
        plugins = [p for p in self.stack.plugins if p.alive()]
        ready = {p.node: self._ready(p) for p in plugins}
        big = [m for m in self.workload.models if len(m.files["model.safetensors"]) >= 2 * MiB]  # time to cut
        held = [(p, m) for p in plugins for m in big if m.digest in ready[p.node]]
        alone = [(p, m) for p, m in held if sum(m.digest in r for r in ready.values()) == 1]
        held = alone or held  # a model on one node only: the copy has no other peer to come from
        if not held:
            return Injected("peer-killed", "no model Ready anywhere yet: nothing to copy")
        source, model = self.rng.choice(held)
        small = self.stack.plugins[DISK_NODE]  # near its watermark it may rightly refuse a copy
        wanted = self.workload.wanted()
        untouched = [p for p in plugins if p not in (source, small) and (p.node, model.digest) not in wanted
                     and model.digest not in {m["digest"] for m in self.workload.store_models(p.node)}]  # fmt: skip
        taker = self.rng.choice(untouched or [None])  # one that neither holds it nor is fetching it already
        if taker is None:
            return Injected("peer-killed", f"{model.name} is on every node: nothing to copy")
        # Every body of the model the hub sends (its weights at the CDN, any file through the repository) held:
        # the copy can only come from a peer.
        hold = self.hub.faults.pause(re.compile(f"{re.escape(model.weights)}|{re.escape(model.repo)}/"))
        self.workload.prefetch(model, [taker.node])
        copied = self._copying(taker, model)
        if copied is None:
            hold.release()
            return Injected("peer-killed", f"{taker.node} did not copy {model.name} from {source.node} within 60 s "
                            "(the hub holding it)", problem=True)  # fmt: skip
        if copied == "done":
            hold.release()
            return Injected("peer-killed", f"{taker.node} copied {model.name} whole before it could be cut: no kill")
        weights = len(model.files["model.safetensors"])
        pid = source.pid
        source.kill()

        def mend():
            hold.release()
            source.start_again()

        detail = (f"kill -9 plugin {source.node} (pid {pid}) with {taker.node} {copied // 1024} KiB into "
                  f"{model.name}'s {weights // MiB} MiB")  # fmt: skip
        return Injected("peer-killed", detail, mend)

    def _copying(self, taker, model) -> int | str | None:
        """Bytes of ``model`` the taker has once past 1 MiB and short of all; "done" if it finished first."""
        partial = taker.cache / "partial" / model.digest.split(":", 1)[1]
        weights = len(model.files["model.safetensors"])

        def seen():
            if MiB <= (got := _bytes_under(partial)) < weights:
                return got
            return "done" if model.digest in self._ready(taker) else None

        try:
            return wait_for(seen, timeout=60, interval=0.05, message="the copy")
        except AssertionError:
            return None

    def _ready(self, plugin) -> set[str]:
        models = self.workload.store_models(plugin.node)
        return {m["digest"] for m in models if m.get("state") == "Ready"}

    def inject_disk_full(self) -> Injected:
        plugin = self.stack.plugins[DISK_NODE]
        volume = self.stack.volume(plugin)
        st = os.statvfs(volume)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        ballast = max(0, int(total * (HIGH_PERCENT + 2) / 100) - (total - free))
        path = volume / "ballast"
        with open(path, "wb") as f:
            f.write(b"\0" * ballast)
        return Injected("disk-full", f"{plugin.node}'s volume filled to {HIGH_PERCENT + 2} %", path.unlink)

    def inject_clock_jump(self) -> Injected:
        step = self.rng.choice([3600, -600, 7200])
        self.stack.clock_file.write_text(f"{step}\n")
        node = self.stack.plugins[CLOCK_NODE].node
        return Injected("clock-jump", f"{node}'s wall clock stepped {step:+d} s",
                        lambda: self.stack.clock_file.write_text("0\n"))  # fmt: skip


def _bytes_under(path) -> int:
    """Bytes written under ``path``: the blocks its files hold (a download's file is made at its full size
    before its ranges arrive, so its length says nothing)."""
    try:
        return sum(min(st.st_size, st.st_blocks * 512) for p in path.rglob("*") if p.is_file() and (st := p.stat()))
    except FileNotFoundError:
        return 0
