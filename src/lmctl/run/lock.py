"""One writer per run directory: ``lmctl train`` and ``lmctl resume`` hold the run directory
they write for as long as they run.

Two runs writing one directory destroy each other's work (``--overwrite-output-dir`` deletes
the checkpoints of the run that is still training), so the writer takes an operating-system
lock (``flock``, through :mod:`filelock`) on ``.lmctl-lock`` inside the directory before it
checks, clears or writes anything there. The kernel releases that lock when its process ends
in any way, SIGKILL and the out-of-memory killer included, so a lock never outlives its run.
Beside it, ``.lmctl-lock.json`` records who holds it (process id, host, start time, command),
for the message that refuses a second writer (exit code 2). The holder removes the record
when it lets go; a record found by the process that just got the lock is that of a run that
was killed, and is taken over with a line that says so. A folder that is not a run directory
(refused as one, or a run that failed before it wrote anything) is left as it was found.

Both files are hidden: uploads and pushes skip hidden files, ``lmctl runs`` and resume read
named files only, and the run marker never lists them (``--overwrite-output-dir`` leaves them
to the run that overwrites). A run that fails before it wrote anything leaves no directory:
the lock's own folders go with it.

Which process holds it: with ``--nproc`` on one machine, the lmctl process that starts the
launcher, before the launch (its processes are restarted by ``--max-restarts`` without the
directory ever being free); its launched processes find its process id in
:data:`HELD_ENV` and the record naming it, and do not try again. Otherwise the process that
writes the run takes it: the main process, and with a storage URL on several machines the
first process of each machine, for its own copy (see ``rundir.commits_checkpoints``).

A run directory in a bucket is held across machines as well, by a lease object in the store
that the main process takes after the local lock (:mod:`lmctl.run.lease`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmctl.distributed import is_main_process, launched
from lmctl.errors import ConfigError, PermissionDenied
from lmctl.run import rundir
from lmctl.storage.atomic import atomic_write

if TYPE_CHECKING:
    from filelock import BaseFileLock

    from lmctl.config.slices import LaunchSpec, RunDirSpec
    from lmctl.console import Console

#: Set by the process that holds a run directory for the processes it launches: its pid.
HELD_ENV = "LMCTL_RUN_LOCK_PID"
#: How long a refused writer waits for the holder's record (written just after the lock).
_RECORD_WAIT_S = 2.0


@dataclass(frozen=True)
class Holder:
    """Who holds a run directory, as its record says."""

    pid: int
    host: str
    started: float
    command: str

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host} since {since} ({self.command})"

    def alive(self) -> bool:
        """Whether the holder still runs (a process on another host is taken to)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def read_holder(path: Path) -> Holder | None:
    """The record of who holds run directory ``path`` (None: no readable record)."""
    try:
        data = json.loads((path / rundir.HOLDER_FILE).read_text(encoding="utf-8"))
        return Holder(
            int(data["pid"]), str(data["host"]), float(data["started"]), str(data["command"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RunDirLock:
    """The lock of run directory ``path``, taken by a process running ``command``."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self._lock: BaseFileLock | None = None
        #: The folders that taking the lock created, deepest last.
        self._created: list[Path] = []

    def acquire(self, console: Console, shown: str) -> None:
        """Take the lock, or refuse with exit code 2 naming its holder. ``shown``: the run
        directory as the user named it."""
        from filelock import FileLock, Timeout

        self._created = _make_dirs(self.path, shown)
        lock = FileLock(str(self.path / rundir.LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise _refusal(self.path, shown) from None
        except OSError as exc:
            self._remove_created()
            raise PermissionDenied(
                f"{shown}: cannot lock the run directory ({exc.strerror or exc})",
                "choose an --output-dir on a file system you can write to",
            ) from exc
        self._lock = lock
        previous = read_holder(self.path)
        if previous is not None and previous.pid != os.getpid():
            console.warn(
                f"{shown}: taking over the run directory from {previous.describe()}, "
                "which is gone (it was killed or its machine stopped)"
            )
        holder = Holder(os.getpid(), socket.gethostname(), round(time.time(), 3), self.command)
        atomic_write(self.path / rundir.HOLDER_FILE, json.dumps(asdict(holder)) + "\n")

    def release(self) -> None:
        """Let go: the record goes. Outside a run directory (a folder refused as one, or a run
        that failed before it wrote anything) the lock file goes too, and so do the folders
        that taking the lock created, if nothing else is in them: all still under the lock,
        so that no one takes it meanwhile. A run directory keeps its empty lock file, which
        every later writer shares."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            holder = read_holder(self.path)
            if holder is not None and holder.pid == os.getpid():
                (self.path / rundir.HOLDER_FILE).unlink(missing_ok=True)
            if not rundir.is_lmctl_run(self.path):
                (self.path / rundir.LOCK_FILE).unlink(missing_ok=True)
                if not rundir.run_entries(self.path):
                    self._remove_created()
        finally:
            lock.release()

    def _remove_created(self) -> None:
        for folder in reversed(self._created):
            with suppress(OSError):
                folder.rmdir()
        self._created = []


def _make_dirs(path: Path, shown: str) -> list[Path]:
    """Create ``path`` and the folders above it that are missing; returns those created."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PermissionDenied(
            f"{shown}: cannot create the run directory ({exc.strerror or exc})",
            "choose an --output-dir you can write to",
        ) from exc
    return list(reversed(missing))


def _refusal(path: Path, shown: str) -> ConfigError:
    """The error that names the live holder of ``path`` (its record may lag the lock by a
    moment: the holder writes it just after taking the lock)."""
    deadline = time.monotonic() + _RECORD_WAIT_S
    holder = read_holder(path)
    while (holder is None or not holder.alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
        holder = read_holder(path)
    if holder is None or not holder.alive():
        who = "another lmctl process (it has just started)"
        stop = "wait for it to end"
    else:
        who = holder.describe()
        stop = f"wait for it to end, or stop it (kill {holder.pid} on {holder.host})"
    return ConfigError(
        f"{shown} is in use by another run: {who}; nothing was touched",
        f"{stop}; a run stopped that way continues with 'lmctl resume {shown}'; or choose "
        "another --output-dir",
        details={"holder": asdict(holder) if holder is not None else None},
    )


def in_use(path: Path) -> bool:
    """Whether another process holds run directory ``path`` now (for a reader that changes
    nothing a live run could be writing; it takes no lock and creates no file)."""
    from filelock import FileLock, Timeout

    if not (path / rundir.LOCK_FILE).is_file():
        return False
    probe = FileLock(str(path / rundir.LOCK_FILE), timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    except OSError:
        return False
    probe.release()
    return False


def _held_for_this_process(path: Path) -> bool:
    """Whether the lmctl process that launched this one holds ``path`` for it."""
    given = os.environ.get(HELD_ENV, "")
    holder = read_holder(path)
    return (
        given.isdigit()
        and holder is not None
        and holder.pid == int(given)
        and holder.host == socket.gethostname()
        and holder.alive()
    )


def holds_run_dir(spec: RunDirSpec, launch: LaunchSpec) -> bool:
    """Whether this process takes the run directory's lock (see the module's docstring)."""
    if spec.output_dir is None:
        return False
    if not launched():
        # Alone, or the process that starts the launcher on one machine.
        return launch.nproc is None or launch.nnodes == 1
    if not rundir.commits_checkpoints(spec):
        return False
    return not _held_for_this_process(rundir.local_run_dir(spec))


@contextmanager
def holding(spec: RunDirSpec, launch: LaunchSpec, console: Console, command: str) -> Iterator[None]:
    """Hold the run directory of ``spec`` inside the block, when this process is the one that
    does (after :func:`lmctl.run.rundir.check_location`: the lock lives inside it)."""
    if not holds_run_dir(spec, launch):
        yield
        return
    path = rundir.local_run_dir(spec)
    lock = RunDirLock(path, command)
    lock.acquire(console, str(spec.output_dir))
    lease = None
    previous = os.environ.get(HELD_ENV)
    try:
        if rundir.is_remote_run(spec) and (not launched() or is_main_process()):
            from lmctl.run.lease import StoreLease

            lease = StoreLease(str(spec.output_dir), command)
            lease.acquire(console, str(spec.output_dir))
        os.environ[HELD_ENV] = str(os.getpid())
        yield
    finally:
        _restore(HELD_ENV, previous)
        if lease is not None:
            lease.release()
        lock.release()


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
