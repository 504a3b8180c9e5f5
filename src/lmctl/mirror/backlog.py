"""The uploads of a run directory on object storage, done beside training.

One background thread takes the uploads in order. Training hands it each checkpoint and goes
on; it waits only when :data:`QUEUE_ENV` checkpoints (the one being uploaded included) wait
already, and says so. Whatever waits (training at that bound, or the run's end for the last
uploads) prints a line every :data:`REPORT_EVERY` seconds naming what it waits for and for
how long, and never waits for ever:

- a store that gives no sign of life (no request answered, no object written) for the retry
  budget, :data:`BUDGET_ENV` seconds, ends the run with exit code 6, whether its requests
  fail or hang: the budget is measured here, not by the upload, which may be stuck in a
  request the client library never times out;
- a signal (Ctrl-C, SIGTERM) makes a wait give up :data:`STOP_GRACE` seconds after it came,
  a second one at once.

The thread is a daemon: a stuck upload never keeps the process from exiting. Nothing is lost
when a wait gives up: every checkpoint was committed to the local copy before it was queued.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lmctl.console import Console
from lmctl.errors import LmctlError
from lmctl.run.signals import stop_requested

#: Checkpoints that may wait for their upload, the one being uploaded included.
QUEUE_ENV = "LMCTL_UPLOAD_QUEUE"
DEFAULT_QUEUE = 5
#: Seconds a store may give no sign of life before the run stops with exit code 6.
BUDGET_ENV = "LMCTL_STORE_RETRY_BUDGET"
DEFAULT_BUDGET = 300.0
#: Seconds between two lines of a wait.
REPORT_EVERY = 30.0
#: Seconds a wait goes on after a signal (an upload about to finish still may).
STOP_GRACE = 10.0
#: Seconds beyond the budget before a wait stops on its own: the upload's own error, which
#: says more, comes first when its request returns.
_SLACK = 5.0


def _setting(name: str, default: float, low: float) -> float:
    try:
        return max(low, float(os.environ.get(name, default)))
    except ValueError:
        return default


def retry_budget() -> float:
    """:data:`BUDGET_ENV`, in seconds (:data:`DEFAULT_BUDGET` when unset or not a number)."""
    return _setting(BUDGET_ENV, DEFAULT_BUDGET, 1.0)


def queue_bound() -> int:
    """:data:`QUEUE_ENV` (:data:`DEFAULT_QUEUE` when unset or not a number)."""
    return int(_setting(QUEUE_ENV, DEFAULT_QUEUE, 1.0))


@dataclass
class _Job:
    what: str
    action: Callable[[], object]
    #: A checkpoint, counted against the bound.
    checkpoint: bool


class GaveUp(Exception):
    """A wait reached its deadline (:meth:`Backlog.drain`)."""


class Backlog:
    """The uploads waiting for the store, done one at a time by a daemon thread.

    ``stopped``: the error a wait raises when a signal stops the run (its message says what
    was not uploaded, where the local copy is and how to continue)."""

    def __init__(
        self,
        url: str,
        console: Console,
        *,
        bound: int,
        stopped: Callable[[str, str], LmctlError],
        stalled: Callable[[str, float], LmctlError],
    ) -> None:
        self.url = url
        self.console = console
        self.bound = bound
        self.budget = retry_budget()
        self._stopped = stopped
        self._stalled = stalled
        self._jobs: deque[_Job] = deque()
        self._current: _Job | None = None
        self._changed = threading.Condition()
        self._closing = threading.Event()
        #: The upload's error, which ends the run at the next wait or checkpoint (raised in
        #: the training thread as it was raised here).
        self.failed: BaseException | None = None
        self._alive_at = time.monotonic()
        self._thread = threading.Thread(target=self._work, name="lmctl-upload", daemon=True)
        self._thread.start()

    # The store's signs of life, noted by the uploads ---------------------------------------

    def alive(self) -> None:
        """The store answered a request or took an object (called by the uploading thread)."""
        self._alive_at = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the store's last sign of life while an upload is under way."""
        with self._changed:
            busy = self._current is not None
        return time.monotonic() - self._alive_at if busy else 0.0

    @property
    def closing(self) -> threading.Event:
        """Set when the run stops: a retrying upload gives up."""
        return self._closing

    # Training's side -----------------------------------------------------------------------

    def check(self) -> None:
        """Raise the upload's error, or the store's silence past the budget."""
        if self.failed is not None:
            raise self.failed
        silent = self.silent_for()
        if silent > self.budget + _SLACK:
            with self._changed:
                what = self._current.what if self._current is not None else "the upload"
            self.failed = self._stalled(what, silent)
            raise self.failed

    def put(self, what: str, action: Callable[[], object], *, checkpoint: bool) -> None:
        """Queue an upload; for a checkpoint, wait first until fewer than the bound wait."""
        self.check()
        if checkpoint and self._waiting() >= self.bound:
            self.console.warn(
                f"training waits: the upload of {self._described()} to {self.url} must finish "
                f"first ({QUEUE_ENV}={self.bound} checkpoints may wait)"
            )
            self._wait(lambda: self._waiting() < self.bound, "training waits")
        with self._changed:
            self._jobs.append(_Job(what, action, checkpoint))
            self._changed.notify_all()

    def drain(self, reason: str, *, deadline: float | None = None) -> None:
        """Wait until every queued upload is done; :class:`GaveUp` at ``deadline``."""
        self._wait(self._idle, reason, deadline=deadline)

    def close(self) -> None:
        """No more uploads: the thread ends after the one under way (or stays stuck in it,
        which keeps nothing from exiting)."""
        self._closing.set()
        with self._changed:
            self._jobs.clear()
            self._changed.notify_all()
        self._thread.join(timeout=1.0)

    def pending(self) -> list[str]:
        """What was not uploaded yet, the upload under way first."""
        with self._changed:
            current = [self._current.what] if self._current is not None else []
            return current + [job.what for job in self._jobs]

    def _waiting(self) -> int:
        with self._changed:
            current = self._current is not None and self._current.checkpoint
            return int(current) + sum(job.checkpoint for job in self._jobs)

    def _idle(self) -> bool:
        with self._changed:
            return self._current is None and not self._jobs

    def _wait(
        self, done: Callable[[], bool], reason: str, *, deadline: float | None = None
    ) -> None:
        """Wait until ``done()``: a line every :data:`REPORT_EVERY` seconds; the upload's
        error, the store's silence past the budget, a signal or ``deadline`` end it."""
        started = time.monotonic()
        report = started + REPORT_EVERY
        try:
            while True:
                self.check()
                if done():
                    return
                now = time.monotonic()
                request = stop_requested()
                if (
                    request is not None
                    and request.at is not None
                    and (request.count > 1 or now >= request.at + STOP_GRACE)
                ):
                    raise self._stopped(str(request.signal_name), self._described())
                if deadline is not None and now >= deadline:
                    raise GaveUp
                if now >= report:
                    silent = self.silent_for()
                    heard = f"; no answer from the store for {silent:.0f} s" if silent >= 1 else ""
                    self.console.warn(
                        f"{reason}: {now - started:.0f} s so far for the upload of "
                        f"{self._described()} to {self.url}{heard} (the run stops after "
                        f"{self.budget:g} s without one, {BUDGET_ENV})"
                    )
                    report += REPORT_EVERY
                with self._changed:
                    self._changed.wait(timeout=1.0)
        except KeyboardInterrupt:
            # Outside the training loop a signal raises here at once.
            raise self._stopped("Ctrl-C or SIGTERM", self._described()) from None

    def _described(self) -> str:
        pending = self.pending()
        if not pending:
            return "nothing"
        more = len(pending) - 1
        return pending[0] + (f" ({more} more waiting)" if more else "")

    # The uploading thread ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._jobs and not self._closing.is_set():
                    self._changed.wait()
                if self._closing.is_set() or self.failed is not None:
                    return
                job = self._current = self._jobs.popleft()
                self._alive_at = time.monotonic()
            try:
                job.action()
            except BaseException as exc:  # raised by the next wait, not lost in the thread
                if self.failed is None:
                    self.failed = exc
            finally:
                with self._changed:
                    self._current = None
                    self._changed.notify_all()
