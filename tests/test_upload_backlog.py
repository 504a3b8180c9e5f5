"""The uploads beside training (lmctl.mirror.backlog): the bound of checkpoints waiting, the
retry budget measured by the store's silence, and a signal that ends a wait."""

from __future__ import annotations

import re
import threading
import time

import pytest

from lmctl.console import Console, OutputOptions
from lmctl.errors import Interrupted, LmctlError, RemoteUnreachable
from lmctl.mirror import backlog
from lmctl.mirror.backlog import Backlog, GaveUp
from lmctl.run import signals


def _backlog(bound: int = 2) -> Backlog:
    def stopped(signal_name: str, pending: str) -> LmctlError:
        return Interrupted(f"interrupted by {signal_name}; not uploaded: {pending}")

    def stalled(what: str, silent: float) -> LmctlError:
        return RemoteUnreachable(f"no answer for {silent:.0f} s while uploading {what}")

    return Backlog("s3://b/run", Console(OutputOptions()), bound=bound, stopped=stopped,
                   stalled=stalled)  # fmt: skip


def test_checkpoints_wait_beside_training_up_to_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    release = threading.Event()
    done: list[str] = []
    uploads = _backlog(bound=2)
    try:
        for name in ("checkpoint-1", "checkpoint-2"):
            uploads.put(
                name, lambda name=name: (release.wait(), done.append(name)), checkpoint=True
            )
        assert uploads.pending() == ["checkpoint-1", "checkpoint-2"]
        # The run's files do not count against the bound.
        uploads.put("the run's files", lambda: done.append("files"), checkpoint=False)
        threading.Timer(0.5, release.set).start()
        started = time.monotonic()
        uploads.put("checkpoint-3", lambda: done.append("checkpoint-3"), checkpoint=True)
        assert time.monotonic() - started >= 0.4  # the bound was reached: training waited
        uploads.drain("the run waits")
    finally:
        uploads.close()
    assert done == ["checkpoint-1", "checkpoint-2", "files", "checkpoint-3"]
    assert "training waits: the upload of checkpoint-1 (2 more waiting) to s3://b/run" in (
        capsys.readouterr().err
    )


def test_an_upload_error_ends_the_next_wait() -> None:
    def fail() -> None:
        raise RemoteUnreachable("the store refused")

    uploads = _backlog()
    try:
        uploads.put("checkpoint-1", fail, checkpoint=True)
        with pytest.raises(RemoteUnreachable, match="the store refused"):
            uploads.drain("the run waits")
        with pytest.raises(RemoteUnreachable, match="the store refused"):
            uploads.put("checkpoint-2", lambda: None, checkpoint=True)
    finally:
        uploads.close()


def test_a_store_silent_past_the_budget_ends_a_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upload is stuck in a request that never returns: the wait says so at each report
    and ends by itself once the store has been silent for the budget (and its slack); the
    thread stays behind."""
    monkeypatch.setenv(backlog.BUDGET_ENV, "2")
    monkeypatch.setattr(backlog, "_SLACK", 0.5)
    monkeypatch.setattr(backlog, "REPORT_EVERY", 1.0)
    stuck = threading.Event()
    uploads = _backlog()
    try:
        uploads.put("checkpoint-1", stuck.wait, checkpoint=True)
        started = time.monotonic()
        with pytest.raises(RemoteUnreachable, match="while uploading checkpoint-1"):
            uploads.drain("the run waits")
        assert time.monotonic() - started < 5
    finally:
        uploads.close()
        stuck.set()
    pattern = (
        r"WARN  the run waits: \d s so far for the upload of checkpoint-1 to s3://b/run; no "
        r"answer from the store for \d s \(the run stops after 2 s without one, "
        r"LMCTL_STORE_RETRY_BUDGET\)"
    )
    assert re.search(pattern, capsys.readouterr().err)


def test_progress_keeps_a_slow_upload_going(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(backlog.BUDGET_ENV, "1")
    monkeypatch.setattr(backlog, "_SLACK", 0.2)
    uploads = _backlog()

    def slow() -> None:
        for _ in range(6):  # 2.4 s in all, never 1 s without a part taken
            time.sleep(0.4)
            uploads.alive()

    try:
        uploads.put("checkpoint-1", slow, checkpoint=True)
        uploads.drain("the run waits")
    finally:
        uploads.close()


def test_a_signal_ends_a_wait_after_its_grace_a_second_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = threading.Event()
    uploads = _backlog()
    request = signals.StopRequest()
    monkeypatch.setattr(signals, "_last", request)
    monkeypatch.setattr(backlog, "STOP_GRACE", 1.0)
    try:
        uploads.put("checkpoint-1", stuck.wait, checkpoint=True)
        request._record("SIGTERM")
        started = time.monotonic()
        with pytest.raises(Interrupted, match="interrupted by SIGTERM; not uploaded: checkpoint-1"):
            uploads.drain("the run waits")
        assert 0.9 < time.monotonic() - started < 3
        request._record("SIGTERM")  # a second one: at once
        monkeypatch.setattr(backlog, "STOP_GRACE", 60.0)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            uploads.drain("the run waits")
        assert time.monotonic() - started < 1.5
        with pytest.raises(GaveUp):
            monkeypatch.setattr(signals, "_last", None)
            uploads.drain("the run waits", deadline=time.monotonic() + 0.2)
    finally:
        uploads.close()
        stuck.set()
