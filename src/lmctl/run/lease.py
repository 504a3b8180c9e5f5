"""One writer per run directory in a bucket: a lease object in the store.

A run directory that is a storage URL (``--output-dir s3://...``) is written into a local
copy and uploaded, so the local lock (:mod:`lmctl.run.lock`) only keeps out writers on the
same machine. Across machines the writer holds a lease: the object ``.lmctl-lease.json`` in
the run directory names its holder (process, host, start time, command) and the time it
expires. The holder renews it every quarter of its term while the run lives, and deletes it
when it ends; a run killed without that leaves a lease that expires within one term
(:data:`TERM_ENV`, 120 seconds by default), after which the next writer takes it over with a
line that says so (at once on the machine of a holder whose process is gone). A writer that
finds a live lease is refused with exit code 2 naming the holder.

Object stores have no compare-and-swap that every one of them offers, so taking a lease is
write, wait, read back: of two writers that start within the same moment, the one whose
lease is read back keeps it and the other is refused. Renewals are bounded requests (see
:func:`lmctl.storage.locations.open_location`): a store that hangs delays a renewal, never
training, and the holder of a lease that lapsed while the store was down renews it when the
store answers again. Hidden names are never fetched, listed as a run's files or pushed.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, LmctlError
from lmctl.storage import locations

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lmctl.console import Console

#: The lease object, in the run directory.
LEASE_FILE = ".lmctl-lease.json"
#: Seconds a lease lasts unless renewed.
TERM_ENV = "LMCTL_LEASE_SECONDS"
DEFAULT_TERM_S = 120.0
#: How long a new holder waits before reading its lease back (a rival's write lands first).
_SETTLE_S = 1.0
#: How long letting go may take before the lease is left to expire.
_RELEASE_WAIT_S = 10.0


def lease_term() -> float:
    """The term of a lease in seconds (:data:`TERM_ENV`; at least 10)."""
    text = os.environ.get(TERM_ENV, "").strip()
    if not text:
        return DEFAULT_TERM_S
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{TERM_ENV}={text}: not a number of seconds", f"e.g. {TERM_ENV}=120"
        ) from None
    if value < 10:
        raise ConfigError(f"{TERM_ENV}={text}: shorter than 10 seconds", f"e.g. {TERM_ENV}=120")
    return value


@dataclass(frozen=True)
class Lease:
    """What the lease object says."""

    token: str
    pid: int
    host: str
    started: float
    command: str
    expires: float

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host} since {since} ({self.command})"

    def live(self, now: float) -> bool:
        """Whether the holder may still be writing: its term has not ended and it is not a
        process of this machine that is gone (taken over at once, as the local lock is)."""
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass
        return self.expires > now


def _parse(data: bytes) -> Lease | None:
    try:
        fields = json.loads(data)
        return Lease(
            str(fields["token"]),
            int(fields["pid"]),
            str(fields["host"]),
            float(fields["started"]),
            str(fields["command"]),
            float(fields["expires"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


class StoreLease:
    """The lease of the run directory at storage URL ``url``, for a process running
    ``command``."""

    def __init__(self, url: str, command: str) -> None:
        self.url = url.rstrip("/")
        self.command = command
        self.term = lease_term()
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._fs: AbstractFileSystem | None = None
        self._path = ""

    # Store access ---------------------------------------------------------------------------
    def _open(self) -> tuple[AbstractFileSystem, str]:
        if self._fs is None:
            location = locations.parse_location(self.url, "--output-dir")
            self._fs, root = locations.open_location(location)
            self._path = f"{root}/{LEASE_FILE}"
        return self._fs, self._path

    def _read(self) -> Lease | None:
        fs, path = self._open()
        try:
            return _parse(fs.cat_file(path))
        except FileNotFoundError:
            return None
        except LmctlError:
            raise
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc

    def _write(self, lease: Lease) -> None:
        fs, path = self._open()
        try:
            if _local(fs):
                # An object store has no directories; a local one needs the run's to exist.
                fs.makedirs(fs._parent(path), exist_ok=True)
            fs.pipe_file(path, (json.dumps(asdict(lease)) + "\n").encode())
        except LmctlError:
            raise
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc

    def _fresh(self, token: str, started: float) -> Lease:
        return Lease(
            token,
            os.getpid(),
            socket.gethostname(),
            started,
            self.command,
            round(time.time() + self.term, 3),
        )

    # The lease's life -----------------------------------------------------------------------
    def acquire(self, console: Console, shown: str) -> None:
        """Take the lease, or refuse with exit code 2 naming its holder."""
        found = self._read()
        if found is not None and found.live(time.time()):
            raise _refusal(shown, found, self.term)
        if found is not None:
            console.warn(
                f"{shown}: taking over the run directory from {found.describe()}, which is "
                "gone (it was killed or its machine stopped)"
            )
        mine = self._fresh(uuid.uuid4().hex, round(time.time(), 3))
        self._write(mine)
        time.sleep(_SETTLE_S)
        kept = self._read()
        if kept is None or kept.token != mine.token:
            raise _refusal(shown, kept or mine, self.term)
        self._lease = mine
        self._renewer = threading.Thread(target=self._renew, name="lmctl-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        """Renew every quarter term until let go; a renewal that fails is tried at the next."""
        while not self._stop.wait(self.term / 4):
            lease = self._lease
            if lease is None:
                return
            renewed = self._fresh(lease.token, lease.started)
            with suppress(Exception):
                self._write(renewed)
                self._lease = renewed

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this process's; a store that does
        not answer within :data:`_RELEASE_WAIT_S` leaves it to expire."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        self._stop.set()

        def let_go() -> None:
            with suppress(Exception):
                current = self._read()
                if current is not None and current.token == lease.token:
                    fs, path = self._open()
                    fs.rm_file(path)

        worker = threading.Thread(target=let_go, name="lmctl-lease-release", daemon=True)
        worker.start()
        worker.join(_RELEASE_WAIT_S)


def _local(fs: AbstractFileSystem) -> bool:
    protocol = fs.protocol
    return "file" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))


def refuse_if_held(url: str, shown: str) -> None:
    """Refuse (exit code 2) a run directory in a bucket whose lease is live, before anything
    is fetched from it (``lmctl resume`` of a run that is still training elsewhere)."""
    lease = StoreLease(url, "")
    found = lease._read()
    if found is not None and found.live(time.time()):
        raise _refusal(shown, found, lease.term)


def _refusal(shown: str, holder: Lease, term: float) -> ConfigError:
    left = max(0, round(holder.expires - time.time()))
    details: dict[str, Any] = {"holder": {k: v for k, v in asdict(holder).items() if k != "token"}}
    return ConfigError(
        f"{shown} is in use by another run: {holder.describe()}; nothing was touched",
        f"wait for it to end, or stop it (kill {holder.pid} on {holder.host}); a run killed "
        f"without ending frees the directory when its lease expires (in {left} s at most, "
        f"{TERM_ENV}={term:g}); or choose another --output-dir",
        details=details,
    )
