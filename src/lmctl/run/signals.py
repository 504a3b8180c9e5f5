"""Ctrl-C and SIGTERM (preemption): finish the current step, checkpoint, then stop.

The first signal only raises a flag that the engine checks after every optimizer step; a
second Ctrl-C aborts at once. A second SIGTERM does not: a pre-emption often reaches a
process twice, from the cluster and from its launcher (torchrun passes SIGTERM on to its
processes), and the checkpoint is still written; what must stop at once gets SIGKILL.
Code that waits outside the step, for an upload to a store, reads the request with
:func:`stop_requested`: it gives up a few seconds after the signal, and at once on a second.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        #: When the first signal came (time.monotonic), and how many came.
        self.at: float | None = None
        self.count = 0

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def adopt(self) -> None:
        """Another process of the run was signalled: this one stops at the same step."""
        if self.signal_name is None:
            self._record("a signal to another process")

    def _record(self, name: str) -> None:
        global _last
        self.count += 1
        if self.signal_name is None:
            self.signal_name, self.at = name, time.monotonic()
        _last = self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        again = self.requested
        self._record(signal.Signals(signum).name)
        if again and signum == signal.SIGINT:
            raise KeyboardInterrupt


#: The request that a signal set last in this process, kept after its block ends: an upload
#: that the run waits for once training stopped gives up in time too.
_last: StopRequest | None = None


def stop_requested() -> StopRequest | None:
    """The request of the newest :func:`graceful_stop` block that a signal reached, or None."""
    return _last


@contextmanager
def graceful_stop() -> Iterator[StopRequest]:
    """Within this block SIGINT/SIGTERM set ``StopRequest.requested`` instead of killing."""
    global _last
    request = StopRequest()
    _last = None
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


def exit_quietly_on_signal(code: int) -> None:
    """Once a command has said its outcome: a signal while the interpreter shuts down (the
    launcher stopping the other processes of a failed run, during the libraries' exit
    handlers) ends the process with that outcome, instead of a traceback from inside an exit
    handler."""

    def _exit(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(ValueError):
            signal.signal(sig, _exit)
