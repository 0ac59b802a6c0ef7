"""Celery beat that sends its tasks only while this process holds the beat Lease.

Several beat replicas may run (``celery -A config beat`` uses this scheduler through
``CELERY_BEAT_SCHEDULER``); one thread per process elects through the Lease ``GPUSTACK_LEADER_BEAT_LEASE``
(``kube.leases``). While standing by, ``tick`` sends nothing and asks to be called again within a retry
period, so a takeover is prompt; a leader that loses the Lease stops sending at its next tick and stands by
again. A new leader first moves every entry's last run to now, so the time it stood by is not caught up in
a burst: each task next runs one period after the takeover. On a clean stop (SIGTERM: beat closes its
scheduler) the Lease is released. With ``GPUSTACK_LEADER_ELECTION=false`` it is Celery's own persistent
scheduler.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from celery.beat import PersistentScheduler
from django.conf import settings

from gpustack_models.kube.leases import LeaseElector, elector_for

log = logging.getLogger(__name__)


class LeaderScheduler(PersistentScheduler):
    elector: LeaseElector | None = None

    def setup_schedule(self):
        # The schedule's file is under GPUSTACK_DATA_DIR, an empty volume in a fresh Pod: its directory first.
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
        if settings.LEADER_ELECTION and self.elector is None:
            self._leading = threading.Event()
            self._closing = threading.Event()
            self._terms = 0  # leaderships begun; ``_term_seen`` is the one whose schedule was reset
            self._term_seen = 0
            self.elector = elector_for(settings.LEADER_BEAT_LEASE)
            threading.Thread(target=self._elect, name="beat-lease", daemon=True).start()

    def _elect(self) -> None:
        """Acquire, keep until lost, stand by again; until the scheduler closes."""
        while not self._closing.is_set():
            if not self.elector.acquire(self._closing):
                return
            self._terms += 1
            self._leading.set()
            lost = self.elector.keep(self._closing)
            self._leading.clear()
            if not lost:
                return

    def tick(self, *args, **kwargs):
        if self.elector is None:
            return super().tick(*args, **kwargs)
        retry = settings.LEADER_RETRY_SECONDS
        if not self._leading.is_set():
            return min(retry, self.max_interval)
        if self._term_seen != self._terms:
            self._term_seen = self._terms
            self._start_from_now()
        # Not past the renew deadline either: a lost Lease stops the sending at the next tick.
        return min(super().tick(*args, **kwargs), retry)

    def _start_from_now(self) -> None:
        """No catch-up of what was due while standing by: every entry's last run becomes now."""
        for entry in self.schedule.values():
            entry.last_run_at = entry.default_now()
        self._heap = None  # rebuilt from the entries at the next tick
        self.sync()
        log.info("beat: leading; every task next runs one period from now")

    def close(self):
        if self.elector is not None:
            self._closing.set()
            self._leading.clear()
            self.elector.release()
        super().close()
