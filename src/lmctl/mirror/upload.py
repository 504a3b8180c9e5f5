"""Run directories on object storage: ``--output-dir s3://bucket/run`` (or ``gs://``,
``file:///abs``, any fsspec store but the Hub).

The run is written into a local copy first (``--staging-dir``, by default a folder per URL in
the cache, see :func:`lmctl.storage.locations.run_staging_dir`), exactly as a local run. Each
checkpoint, once committed there, is uploaded by a background thread while training goes on,
with the rule of ``lmctl push`` (:class:`lmctl.publish.stores.StoreTarget`): every file is uploaded
under a staging prefix and verified, moved into place, and the checkpoint's
``lmctl-manifest.json`` is written last. A checkpoint without that manifest is incomplete,
and nothing reads it. The run's own files (config, metrics, marker) go up before each
checkpoint, so that the store holds them once a checkpoint is complete there; at the end the
final model, results, model card, ``loss.png`` and tracker logs go up the same way.

Training waits for an upload only when ``LMCTL_UPLOAD_QUEUE`` checkpoints wait for theirs
already (at most ``--save-total-limit``, so that a rotation never deletes a checkpoint still
to be read); see :mod:`lmctl.mirror.backlog`, which also bounds every wait. With
``--save-total-limit`` the oldest complete checkpoints in the store are deleted (manifest
first), never the newest complete one; leftovers of an interrupted upload older than it are
deleted too, and a resumed run deletes those newer than it. A failed upload is tried again
with a doubling wait (at most 30 s) until the store has given no sign of life for the retry
budget (``LMCTL_STORE_RETRY_BUDGET``) or ``LMCTL_UPLOAD_ATTEMPTS`` attempts failed; the run
then stops with exit code 6 (7 when the credentials are refused) and its local copy is kept,
to be continued with ``lmctl resume URL`` (or, when training had finished, its upload
finished with ``lmctl push``).

Several machines (``--nnodes``): each writes its own local copy (by default one folder per
URL and machine rank), and the first process of each machine commits its machine's part of
every checkpoint there. The main process uploads the run and each checkpoint as above, and
first lists the files it publishes (``node-0.json`` in ``.lmctl-parts/`` below the
checkpoint's staging prefix). The first process of every other machine
(:class:`MachinePart`) then uploads the files of its machine's part that are not on that
list (its processes' RNG states and sharded optimizer states) into ``.lmctl-parts/node-K/``,
verified, and writes its marker ``node-K.json`` last. The main process waits for every
machine's marker and moves their files into the checkpoint with its own, so that the
manifest, written last as always, marks the checkpoint of every machine complete. A resume
on several machines takes the store's newest complete checkpoint whole on each
(:func:`lmctl.mirror.fetch.sync_checkpoints`); a machine's local copy alone is never
resumed from. Reading a run directory in a store back is :mod:`lmctl.mirror.fetch`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lmctl import distributed
from lmctl.errors import ConfigError, Interrupted, LmctlError, PermissionDenied, RemoteUnreachable
from lmctl.mirror.backlog import BUDGET_ENV, STOP_GRACE, Backlog, GaveUp, queue_bound
from lmctl.mirror.fetch import is_complete, names_in, newest_complete
from lmctl.publish.files import LocalFile, human_size, select_files
from lmctl.publish.stores import StagedFile, StoreTarget
from lmctl.run import checkpoints, rundir, signals
from lmctl.storage import locations

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lmctl.config.slices import RunDirSpec
    from lmctl.console import Console

#: Attempts of one upload before the run stops (unset: as many as the retry budget allows),
#: and the first wait between two (doubling up to MAX_BACKOFF).
ATTEMPTS_ENV = "LMCTL_UPLOAD_ATTEMPTS"
BACKOFF_ENV = "LMCTL_UPLOAD_BACKOFF"
DEFAULT_BACKOFF = 2.0
MAX_BACKOFF = 30.0
#: Written while the run trains (the trackers' logs go up at the end, once closed).
_LIVE_LEAVE_OUT = ("runs",)
#: Below a checkpoint's staging prefix: each machine's part, and the marker of each.
PARTS = ".lmctl-parts"
#: How long one machine waits for another's part of a checkpoint (seconds).
PART_TIMEOUT_ENV = "LMCTL_PART_TIMEOUT"
DEFAULT_PART_TIMEOUT = 3600.0
#: The staging prefix of a checkpoint's upload (see StoreTarget.staging_path).
_STAGED_CHECKPOINT = re.compile(r"^\.(checkpoint-\d+)\.lmctl-staging$")

T = TypeVar("T")


def _attempts() -> tuple[int | None, float]:
    try:
        given = os.environ.get(ATTEMPTS_ENV)
        attempts = max(1, int(given)) if given else None
        backoff = max(0.0, float(os.environ.get(BACKOFF_ENV, DEFAULT_BACKOFF)))
    except ValueError:
        return None, DEFAULT_BACKOFF
    return attempts, backoff


class RunMirror:
    """A run's local copy, uploaded to its remote run directory as it is written."""

    def __init__(
        self, spec: RunDirSpec, run_dir: Path, console: Console, *, save_total_limit: int | None
    ) -> None:
        assert spec.output_dir is not None
        self.url = spec.output_dir.rstrip("/")
        self.location = locations.parse_location(self.url, "--output-dir", destination=False)
        self.local = run_dir
        self.console = console
        self.limit = save_total_limit
        self.resuming = spec.resume_from_checkpoint is not None
        #: The command that continues the run from this machine's copy.
        self.resume = f"lmctl resume {self.url}" + (
            f" --staging-dir {run_dir}" if spec.staging_dir is not None else ""
        )
        #: Machines whose parts make up each checkpoint.
        self.nodes = distributed.nodes()
        #: The uploads under way, while the run trains (see :meth:`uploading`).
        self._backlog: Backlog | None = None
        #: Set once training finished: what is left is the upload alone.
        self._trained = False
        #: Set when a signal ended a wait for the uploads: nothing more is waited for.
        self._gave_up = False
        #: Copies of the run's files taken for uploads still to run (see _snapshot).
        self._snapshots: set[Path] = set()

    # Before the run ---------------------------------------------------------------------

    def check(self) -> None:
        """Write access, and no other run at the URL unless this one continues it."""
        StoreTarget(self.location, self.console, verbose=False).check_access()
        self.console.info(f"{self.url}: write access checked")
        try:
            fs, root = locations.open_location(self.location)
            found = names_in(fs, root)
            if self.resuming:
                self._discard_unfinished(fs, root, found)
                return
        except LmctlError:
            raise
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc
        if found & {rundir.CONFIG_FILE, locations.MANIFEST} or any(
            checkpoints.CHECKPOINT_PATTERN.match(name) for name in found
        ):
            raise ConfigError(
                f"--output-dir {self.url} already holds a run; nothing was touched",
                f"continue it with 'lmctl resume {self.url}', or choose a new --output-dir",
            )

    def _discard_unfinished(self, fs: AbstractFileSystem, root: str, names: set[str]) -> None:
        """Before a resumed run uploads again: the leftovers of uploads newer than the newest
        complete checkpoint (their machines' parts above all) go, so that none is taken for
        a part of the checkpoint that the resumed run saves under the same step."""
        newest = newest_complete(fs, root, names)
        for name in names:
            match = _STAGED_CHECKPOINT.match(name)
            if match and (newest is None or checkpoints.checkpoint_step(Path(match[1])) > newest):
                fs.rm(f"{root}/{name}", recursive=True)

    # While it runs ----------------------------------------------------------------------

    @property
    def backlog(self) -> Backlog:
        assert self._backlog is not None, "only inside uploading()"
        return self._backlog

    @contextmanager
    def uploading(self) -> Iterator[RunMirror]:
        """Upload each checkpoint committed inside the block; on the way out of a run that
        stopped early (a signal, a failure) send what was saved if the store takes it within
        a few seconds, never waiting for a store that failed or stopped answering."""
        bound = queue_bound()
        if self.limit:
            bound = min(bound, self.limit)  # a rotation never deletes one waiting
        self._backlog = Backlog(
            self.url, self.console, bound=bound, stopped=self._stopped, stalled=self._stalled
        )
        checkpoints.checkpoint_listeners.append(self.checkpoint_saved)
        self.console.info(
            f"run directory {self.url}: written to {self.local} first; each checkpoint is "
            "uploaded when complete (--staging-dir chooses the local folder)"
        )
        try:
            yield self
        except BaseException as exc:
            # A second signal, a store that failed, or a wait that a signal ended: at once.
            given_up = self._gave_up or isinstance(exc, KeyboardInterrupt)
            if self.backlog.failed is None and not given_up:
                self._flush_quietly()
            raise
        finally:
            checkpoints.checkpoint_listeners.remove(self.checkpoint_saved)
            self.backlog.close()
            for snapshot in list(self._snapshots):  # of uploads that never ran
                shutil.rmtree(snapshot, ignore_errors=True)

    def checkpoint_saved(self, checkpoint: Path) -> None:
        """Called in the training thread once ``checkpoint`` is committed: its upload goes on
        beside training (training waits only at the bound of checkpoints waiting)."""
        upload = self._upload_of(checkpoint)
        self.backlog.put(checkpoint.name, upload, checkpoint=True)

    def _upload_of(self, checkpoint: Path) -> Callable[[], None]:
        """The upload of a checkpoint, with what it needs from the training thread now."""
        return partial(self._upload_checkpoint, checkpoint, self._snapshot())

    def finish(self) -> None:
        """The run wrote everything: its files go up after the last checkpoint."""
        self._trained = True
        files = self._run_files(final=True)

        def send() -> None:
            result = self._retrying("the run's files", lambda: self._publish("", files))
            self.console.info(
                f"uploaded the run to {self.url} ({len(files)} files, "
                f"{human_size(sum(f.size for f in files))}, {len(result['uploaded'])} new); "
                f"the local copy stays in {self.local}"
            )

        self.backlog.put("the run's files", send, checkpoint=False)
        self.backlog.drain("the run finished training and waits")

    def _flush_quietly(self) -> None:
        """After an interruption or a failure: what was saved still goes up if it can, within
        a few seconds of a signal."""
        request = signals.stop_requested()
        deadline = None if request is None or request.at is None else request.at + STOP_GRACE
        try:
            files = self._run_files(final=False)
            self.backlog.put(
                "the run's files",
                lambda: self._retrying("the run's files", lambda: self._publish("", files)),
                checkpoint=False,
            )
            self.backlog.drain("the run stopped and waits", deadline=deadline)
        except GaveUp:
            self.console.warn(
                f"not uploaded to {self.url}: {', '.join(self.backlog.pending())}; the local "
                f"copy stays in {self.local}; continue with: {self._continue()}"
            )
        except LmctlError as exc:
            self.console.warn(f"{exc.message}; the local copy stays in {self.local}")

    def _continue(self) -> str:
        """The command that finishes what this run left: its training, or (once training
        finished) its upload."""
        if self._trained:
            return f"lmctl push {shlex.quote(str(self.local))} --to {self.url}"
        return self.resume

    def _stopped(self, signal_name: str, pending: str) -> LmctlError:
        self._gave_up = True
        return Interrupted(
            f"interrupted by {signal_name} while the upload of {pending} to {self.url} had "
            f"not finished; the local copy in {self.local} is complete",
            f"continue with: {self._continue()}",
        )

    def _stalled(self, what: str, silent: float) -> LmctlError:
        return RemoteUnreachable(
            f"the store at {self.url} has not answered for {silent:.0f} s, past the retry "
            f"budget ({BUDGET_ENV}={self.backlog.budget:g}); the upload of {what} did not "
            f"finish and the run stopped; its local copy in {self.local} is complete",
            f"check the store and the network, then continue with: {self._continue()}",
        )

    def _snapshot(self) -> Path:
        """A copy of the run's own files as they are now (the metrics log keeps growing)."""
        folder = Path(tempfile.mkdtemp(prefix=f".{self.local.name}-upload-", dir=self.local.parent))
        self._snapshots.add(folder)
        for item in self._run_files(final=False):
            target = folder / item.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item.path, target)
        return folder

    def _run_files(self, *, final: bool, root: Path | None = None) -> list[LocalFile]:
        selection = select_files(
            root or self.local,
            include_checkpoints=False,
            include_optimizer=False,
            require_model=False,  # a run that only evaluates has no model of its own
            leave_out=() if final else _LIVE_LEAVE_OUT,
        )
        for rel, key in selection.withheld.items():
            self.console.warn(f"not uploading {rel}: it holds a secret ({key})")
        return selection.files

    def _upload_checkpoint(self, checkpoint: Path, snapshot: Path) -> None:
        try:
            started = time.monotonic()
            selection = select_files(
                checkpoint, include_checkpoints=False, include_optimizer=True, require_model=False
            )
            files = selection.files
            parts = self._parts_of(checkpoint.name, files)
            # The run's files first: a complete checkpoint in the store is one a resume can
            # read, also the first one of a run killed right after its manifest went up.
            run_files = self._run_files(final=False, root=snapshot)
            self._retrying("the run's files", lambda: self._publish("", run_files))
            self._retrying(checkpoint.name, lambda: self._publish(checkpoint.name, files, parts))
            self._retrying(f"{checkpoint.name} rotation", self._rotate_remote)
            size = human_size(sum(f.size for f in files))
            seconds = time.monotonic() - started
            self.console.info(
                f"uploaded {checkpoint.name} to {self.url} ({size} in {seconds:.1f} s)"
            )
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
            self._snapshots.discard(snapshot)

    def _publish(
        self, rel: str, files: list[LocalFile], parts: tuple[StagedFile, ...] = ()
    ) -> dict[str, Any]:
        return self._target(rel).publish(files, parts)

    def _target(self, rel: str) -> StoreTarget:
        url, protocol, path = self.location.url, self.location.protocol, self.location.path
        location = (
            locations.Location(f"{url}/{rel}", protocol, f"{path}/{rel}") if rel else self.location
        )
        return StoreTarget(
            location,
            self.console,
            verbose=False,
            access_checked=True,
            progress=self.backlog.alive,
        )

    def _parts_prefix(self, name: str) -> tuple[AbstractFileSystem, str]:
        """Where the machines' parts of checkpoint ``name`` are staged."""
        target = self._target(name)
        fs, root = locations.open_location(target.location)
        return fs, f"{target.staging_path(root)}/{PARTS}"

    def _parts_of(self, name: str, files: list[LocalFile]) -> tuple[StagedFile, ...]:
        """The other machines' parts of checkpoint ``name``, once each is staged: this
        process lists its own files first, and the others leave those out."""
        if self.nodes == 1:
            return ()
        fs, prefix = self._parts_prefix(name)
        own = {item.rel for item in files}
        self._retrying(
            f"{name}'s file list",
            lambda: self._target(name).write_json(
                fs, f"{prefix}/node-0.json", {"files": sorted(own)}
            ),
        )
        parts: list[StagedFile] = []
        for node in range(1, self.nodes):
            what = f"machine {node}'s part of {name}"
            marker = self._await(fs, f"{prefix}/node-{node}.json", what)
            for item in marker.get("files", []):
                if item["path"] in own:
                    continue
                digests = locations.Digests(item["sha256"], item.get("md5"))
                path = f"{prefix}/node-{node}/{item['path']}"
                parts.append(StagedFile(item["path"], path, item["size"], digests))
        return tuple(parts)

    def _await(self, fs: AbstractFileSystem, path: str, what: str) -> dict[str, Any]:
        """The JSON object another machine writes at ``path``, once it is there."""
        try:
            timeout = float(os.environ.get(PART_TIMEOUT_ENV, DEFAULT_PART_TIMEOUT))
        except ValueError:
            timeout = DEFAULT_PART_TIMEOUT
        deadline = time.monotonic() + timeout
        while not self.backlog.closing.is_set():
            fs.invalidate_cache(path)
            with suppress(FileNotFoundError, ValueError):
                with fs.open(path, "rb") as handle:
                    data = json.loads(handle.read())
                if isinstance(data, dict):
                    return data
            self.backlog.alive()  # the store answered: it is the other machine that is late
            if time.monotonic() > deadline:
                raise RemoteUnreachable(
                    f"{what} did not reach {self.url} within {timeout:g} s; the run stopped "
                    f"and its local copy is kept in {self.local}",
                    f"check that machine's log, then continue with: {self.resume}",
                )
            time.sleep(0.2)
        raise RemoteUnreachable(
            f"the run stopped before {what} reached {self.url}", f"continue with: {self.resume}"
        )

    def _retrying(self, what: str, action: Callable[[], T]) -> T:
        """``action``, tried again with a doubling wait until it succeeds, the store gave no
        sign of life for the retry budget, or ``LMCTL_UPLOAD_ATTEMPTS`` attempts failed."""
        attempts, wait = _attempts()
        attempt = 0
        while True:
            attempt += 1
            try:
                result = action()
                self.backlog.alive()
                return result
            except PermissionDenied as exc:
                raise PermissionDenied(
                    f"uploading {what} to {self.url} failed: {exc.message}; the run stopped "
                    f"and its local copy is kept in {self.local}",
                    f"{exc.hint}; then continue with: {self._continue()}",
                ) from exc
            except Exception as exc:
                detail = exc.message if isinstance(exc, LmctlError) else f"{exc}"
                detail = detail or type(exc).__name__
                silent = self.backlog.silent_for()
                if attempt == attempts or silent + wait > self.backlog.budget:
                    within = (
                        ""
                        if attempt == attempts
                        else f" and gave no sign of life for {silent:.0f} s ({BUDGET_ENV}="
                        f"{self.backlog.budget:g})"
                    )
                    raise RemoteUnreachable(
                        f"uploading {what} to {self.url} failed {attempt} times ({detail})"
                        f"{within}; the run stopped and its local copy is kept in {self.local}",
                        f"check the store and the network, then continue with: {self._continue()}",
                    ) from exc
                of = f"{attempt} of {attempts}" if attempts else f"attempt {attempt}"
                self.console.warn(
                    f"uploading {what} to {self.url} failed ({detail}); trying again in "
                    f"{wait:g} s ({of})"
                )
                if self.backlog.closing.wait(wait):
                    raise RemoteUnreachable(
                        f"the run stopped before {what} was uploaded to {self.url}",
                        f"continue with: {self._continue()}",
                    ) from exc
                wait = min(wait * 2, MAX_BACKOFF)

    def _rotate_remote(self) -> None:
        """Keep the newest ``--save-total-limit`` complete checkpoints in the store; delete
        leftovers of interrupted uploads older than the newest complete one."""
        fs, root = locations.open_location(self.location)
        steps = {
            int(match.group(1)): f"{root}/{name}"
            for name in names_in(fs, root)
            if (match := checkpoints.CHECKPOINT_PATTERN.match(name))
        }
        complete = sorted(s for s, path in steps.items() if is_complete(fs, path))
        if not complete:
            return
        keep = set(complete[-self.limit :]) if self.limit else set(complete)
        for step, path in sorted(steps.items()):
            if step in keep or step > complete[-1]:
                continue
            with suppress(FileNotFoundError):
                fs.rm_file(f"{path}/{locations.MANIFEST}")  # first: no longer complete
            with suppress(FileNotFoundError):
                fs.rm(path, recursive=True)
            self.console.info(f"deleted {path.rsplit('/', 1)[-1]} from {self.url}")


class MachinePart(RunMirror):
    """On a machine other than the first, in its first process: uploads the machine's part of
    each checkpoint for the main process to publish (see the module's description)."""

    def check(self) -> None:
        StoreTarget(self.location, self.console, verbose=False).check_access()

    def finish(self) -> None:
        self.backlog.drain("the run finished training and waits")

    def _flush_quietly(self) -> None:
        request = signals.stop_requested()
        deadline = None if request is None or request.at is None else request.at + STOP_GRACE
        try:
            self.backlog.drain("the run stopped and waits", deadline=deadline)
        except (GaveUp, LmctlError):
            self.console.warn(
                f"not uploaded to {self.url}: {', '.join(self.backlog.pending()) or 'nothing'}; "
                f"the local copy stays in {self.local}"
            )

    def _upload_of(self, checkpoint: Path) -> Callable[[], None]:
        return partial(self._upload_part, checkpoint)

    def _upload_part(self, checkpoint: Path) -> None:
        node = distributed.node_rank()
        fs, prefix = self._parts_prefix(checkpoint.name)
        listed = self._await(
            fs, f"{prefix}/node-0.json", f"the first machine's list of {checkpoint.name}"
        )
        theirs = set(listed.get("files", []))
        selection = select_files(
            checkpoint,
            include_checkpoints=False,
            include_optimizer=True,
            require_model=False,
            machine_part=True,
        )
        files = [item for item in selection.files if item.rel not in theirs]
        target = self._target(checkpoint.name)

        def send() -> None:
            staged = []
            for item in files:
                digests = locations.file_digests(item.path)
                remote = f"{prefix}/node-{node}/{item.rel}"
                if not locations.object_matches(fs, remote, item.size, digests):
                    target.upload_verified(fs, item, remote, digests)
                staged.append(
                    {"path": item.rel, "size": item.size, "sha256": digests.sha256,
                     "md5": digests.known_md5}
                )  # fmt: skip
            target.write_json(fs, f"{prefix}/node-{node}.json", {"files": staged})

        self._retrying(f"machine {node}'s part of {checkpoint.name}", send)
        self.console.info(f"uploaded machine {node}'s part of {checkpoint.name} to {self.url}")


def mirror_for(
    spec: RunDirSpec, run_dir: Path, console: Console, *, save_total_limit: int | None
) -> RunMirror | None:
    """The mirror of a run whose --output-dir is a storage URL, in the process that uploads:
    the main process, and the first process of every other machine (its part of each
    checkpoint). None for a local run directory and in the other processes."""
    if not rundir.is_remote_run(spec):
        return None
    if distributed.is_main_process():
        return RunMirror(spec, run_dir, console, save_total_limit=save_total_limit)
    if rundir.commits_checkpoints(spec):
        return MachinePart(spec, run_dir, console, save_total_limit=save_total_limit)
    return None
