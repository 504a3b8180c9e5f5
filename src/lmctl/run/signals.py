"""Ctrl-C and SIGTERM (preemption): finish the current step, checkpoint, then stop.

The first signal only raises a flag that the engine checks after every optimizer step; a
second Ctrl-C aborts at once. A second SIGTERM does not: a pre-emption often reaches a
process twice, from the cluster and from its launcher (torchrun passes SIGTERM on to its
processes), and the checkpoint is still written; what must stop at once gets SIGKILL.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def adopt(self) -> None:
        """Another process of the run was signalled: this one stops at the same step."""
        if self.signal_name is None:
            self.signal_name = "a signal to another process"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signal_name = signal.Signals(signum).name


@contextmanager
def graceful_stop() -> Iterator[StopRequest]:
    """Within this block SIGINT/SIGTERM set ``StopRequest.requested`` instead of killing."""
    request = StopRequest()
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[int(sig)] = signal.signal(sig, request._handle)
        except ValueError:  # not the main thread: leave signals alone
            continue
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def sigterm_as_interrupt() -> None:
    """Outside training, SIGTERM behaves like Ctrl-C (clean exit 130, no traceback)."""

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with suppress(ValueError):
        signal.signal(signal.SIGTERM, _raise)
