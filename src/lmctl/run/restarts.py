"""Restarts by torchrun's elastic agent (``--max-restarts``): what ended the last attempt,
and where the restarted processes continue from.

The agent keeps no account of how its processes ended for the processes it starts next, so
lmctl keeps its own: each process of a run that may be restarted notes, in a small JSON file
in this machine's cache, when it starts and how it ends (exit code and message). A process
that noted no end and is gone was killed by a signal it cannot catch (SIGKILL, the
out-of-memory killer). A machine sees the notes of its own processes only.

A process is a restart when the agent says so (``TORCHELASTIC_RESTART_COUNT``), or when its
agent started a process of the run before that has ended: on several machines, the agents
also restart the healthy machines' processes when a machine rejoins, without counting it.
A restarted process continues from the newest complete checkpoint of its run (as
``--resume-from-checkpoint auto``); the main process records each restart (the step it
continues from, and the cause) in the run's log and in ``metrics.jsonl``, where
``lmctl runs`` reads it. Light: nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.distributed import rank, restart_count, restartable, world_size
from lmctl.run import checkpoints, history, rundir
from lmctl.run.history import read_records
from lmctl.storage.atomic import atomic_write
from lmctl.storage.paths import cache_root

if TYPE_CHECKING:
    from lmctl.config.slices import RunDirSpec
    from lmctl.console import Console


def _folder() -> Path:
    """This run's notes on this machine: the same folder for every process of the run (they
    share the agent's run id, the working directory and the command line)."""
    run = "\0".join([os.environ.get("TORCHELASTIC_RUN_ID", ""), os.getcwd(), *sys.argv[1:]])
    return cache_root() / "processes" / hashlib.sha256(run.encode()).hexdigest()[:16]


def _own_note() -> Path:
    return _folder() / f"{os.getpid()}.json"


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _notes() -> dict[Path, dict[str, Any]]:
    """The notes of this run's other processes on this machine."""
    found = {}
    for file in sorted(_folder().glob("*.json")):
        note = _read(file)
        if note is not None and file != _own_note():
            found[file] = note
    return found


def note_start() -> None:
    """Note that this process started, and whether it is a restart. Notes whose agent is no
    longer running are left from an earlier run of the same command, and go."""
    if not restartable():
        return
    agent = os.getppid()
    earlier = False  # a process that this agent started before, and that has ended
    for file, note in _notes().items():
        if not _alive(note.get("agent")):
            file.unlink(missing_ok=True)
        elif note.get("agent") == agent and not _alive(note.get("pid")):
            earlier = True
    note = {
        "rank": rank(),
        "pid": os.getpid(),
        "agent": agent,
        "host": socket.gethostname(),
        "started": round(time.time(), 3),
        "restarted": restart_count() > 0 or earlier,
    }
    _write(_own_note(), note)


def note_end(code: int, message: str | None) -> None:
    """Note how this process ends: its exit code, and the error message if it failed (a
    process that succeeded leaves no note behind)."""
    if not restartable():
        return
    if code == 0:
        _own_note().unlink(missing_ok=True)
        with suppress(OSError):
            _folder().rmdir()  # the last of the run's processes on this machine
        return
    note = _read(_own_note()) or {"rank": rank(), "pid": os.getpid()}
    note.update({"ended": round(time.time(), 3), "exit_code": int(code)})
    if message:
        note["message"] = message
    _write(_own_note(), note)


def restarted() -> bool:
    """Whether the elastic agent started this process again after a failure."""
    note = _read(_own_note()) if restartable() else None
    return bool(note and note.get("restarted"))


def _write(file: Path, note: dict[str, Any]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(file, json.dumps(note) + "\n")


def _read(file: Path) -> dict[str, Any] | None:
    try:
        note = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def previous_cause() -> str:
    """What ended the previous attempt, as far as this machine saw it: a process that noted
    no end and is gone was killed; else the first to fail."""
    ended = [note for note in _notes().values() if not _alive(note.get("pid"))]
    killed = sorted((n for n in ended if "exit_code" not in n), key=lambda n: n.get("rank", 0))
    if killed:
        names = ", ".join(f"rank {n.get('rank')} (pid {n.get('pid')})" for n in killed)
        verb = "was" if len(killed) == 1 else "were"
        return (
            f"{names} {verb} killed: ended without an exit of its own (SIGKILL, or the "
            "out-of-memory killer)"
        )
    failed = sorted((n for n in ended if n.get("exit_code")), key=lambda n: n.get("ended", 0))
    if failed:
        first = failed[0]
        detail = f": {first['message']}" if first.get("message") else ""
        return f"rank {first.get('rank')} exited with code {first['exit_code']}{detail}"
    return "a process on another machine ended (that machine's log names it)"


def _forget_ended() -> None:
    """The notes of processes that are gone have been accounted for by a restart."""
    for file, note in _notes().items():
        if not _alive(note.get("pid")):
            file.unlink(missing_ok=True)


def continue_after_restart(spec: RunDirSpec) -> RunDirSpec:
    """The run directory's options for a restarted process: from the newest complete
    checkpoint of the run (a checkpoint given to the first attempt only until the run has
    one of its own)."""
    if not restarted() or spec.resume_from_checkpoint == "auto":
        return spec
    given = spec.resume_from_checkpoint
    if given is not None and checkpoints.latest_checkpoint(rundir.local_run_dir(spec)) is None:
        return spec
    return replace(spec, resume_from_checkpoint="auto")


def record_restart(run_dir: Path, checkpoint: Path | None, console: Console) -> None:
    """In the main process of a restarted run: the restart in the log and ``metrics.jsonl``."""
    step = checkpoints.checkpoint_step(checkpoint) if checkpoint is not None else 0
    cause = previous_cause()
    _forget_ended()
    where = f"{checkpoint.name} (step {step})" if checkpoint is not None else "step 0"
    number = _restarts_recorded(run_dir) + 1
    record: dict[str, Any] = {"event": "restart", "restart": number, "step": step}
    if checkpoint is not None:
        record["checkpoint"] = checkpoint.name
        saved = checkpoints.checkpoint_world_size(checkpoint) if checkpoint.is_dir() else None
        if saved is not None and saved != world_size():
            # Machines were lost or came back (--nnodes MIN:MAX).
            record.update(processes=world_size(), processes_before=saved)
            where += f" on {world_size()} process(es) instead of {saved}"
    console.warn(f"restart {number} after {cause}: continuing from {where}")
    history.append_metrics(run_dir, {**record, "cause": cause})


def _restarts_recorded(run_dir: Path) -> int:
    """How many restarts the run's metrics log holds already."""
    return sum(1 for record in read_records(run_dir) if record.get("event") == "restart")
