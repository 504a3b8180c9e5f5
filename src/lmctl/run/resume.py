"""Continuing a run: its saved config, its newest complete checkpoint, and what may change.

``lmctl resume RUN_DIR`` re-reads ``RUN_DIR/lmctl.yaml`` and continues from the newest
complete checkpoint (a half-written or corrupted one is skipped with a warning). Only options
that cannot silently change what the run learns may be overridden; everything else is fixed
by the run. Light: nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed
from lmctl.config.fields import flag_name
from lmctl.config.slices import DataSpec, LaunchSpec, LoopSpec, ScaleSpec, field_names, take
from lmctl.errors import ConfigError
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run import checkpoints, history, reshard, rundir
from lmctl.run.lock import HELD_ENV
from lmctl.run.runtime import STREAM_WORLD_NOTE, batch_on
from lmctl.storage import atomic
from lmctl.storage.paths import is_remote, local_path, url_scheme

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.objectives.base import Objective

#: Options a resumed run may change: its length, how often it saves, logs and evaluates, and
#: where it reports. Anything else (objective, model, tokenizer, data, preprocessing,
#: optimisation, seed, engine) would make the continued run a different one.
RESUME_OVERRIDES = (
    "max_steps",
    "num_train_epochs",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "logging_steps",
    "eval_strategy",
    "eval_steps",
    "do_eval",
    "per_device_eval_batch_size",
    "report_to",
    # Whether a training file changed since the run started is refused, or only warned about.
    "strict_resume",
    # The learning-rate schedule goes on, or starts again over the steps left.
    "restart_schedule",
    # Where and how the processes run (each machine of a multi-node run resumes with its own
    # rank); a checkpoint refuses to continue on another number of processes.
    *field_names(LaunchSpec),
    # Where a remote run directory's local copy is (it holds what was not uploaded yet).
    "staging_dir",
)


@dataclass
class ResumePlan:
    run_dir: Path
    objective: Objective
    config: TrainConfig
    checkpoint: Path
    step: int

    def describe(self) -> dict[str, Any]:
        from lmctl.config.loader import dump_config

        return {
            "run_dir": str(self.run_dir),
            "checkpoint": str(self.checkpoint),
            "step": self.step,
            "config": {"objective": self.objective.name, **dump_config(self.config, masked=True)},
        }


def resume_command(run_dir: Path | str) -> str:
    """The exact command that continues ``run_dir``."""
    return f"lmctl resume {shlex.quote(str(run_dir))}"


def refuse_fixed_options(forbidden: list[str], run_dir: str) -> None:
    """Options that would change the run are refused before anything is read."""
    if not forbidden:
        return
    if "--config" in forbidden:
        raise ConfigError(
            f"--config can't be given to resume: the run's config is {run_dir}/"
            f"{rundir.CONFIG_FILE}",
            "drop --config; change the run's length or saving with the flags in "
            "'lmctl resume --help'",
        )
    objective = _saved_objective(Path(run_dir)) or "<objective>"
    allowed = ", ".join(flag_name(name) for name in RESUME_OVERRIDES)
    listed = ", ".join(forbidden)
    verb = "is" if len(forbidden) == 1 else "are"
    raise ConfigError(
        f"{listed} {verb} fixed by the run in {run_dir} and can't be changed when resuming "
        "(the continued run would silently differ from the one its checkpoints came from)",
        f"resume accepts only {allowed}; to change {listed}, start a new run: "
        f"lmctl train {objective} --config {Path(run_dir) / rundir.CONFIG_FILE} "
        f"{forbidden[0]} ... --output-dir NEW_DIR",
    )


def how_to_finish(run_dir: Path) -> str:
    """What finishes a run that stopped early: resuming it when it has a checkpoint to
    resume from, else starting it again (resume would only say there is no checkpoint)."""
    if checkpoints.latest_checkpoint(run_dir) is not None:
        return f"finish it with '{resume_command(run_dir)}'"
    objective = _saved_objective(run_dir) or "<objective>"
    return (
        "it stopped before its first checkpoint, so there is nothing to resume; start it "
        f"again with: {rundir.restart_command(objective, run_dir)}"
    )


def _saved_objective(run_dir: Path) -> str | None:
    try:
        value = rundir.read_config(run_dir).get("objective")
    except ConfigError:
        return None
    return value if isinstance(value, str) else None


def check_run_dir(run_dir: Path) -> None:
    """A directory that ``lmctl train`` wrote, or one clear error naming what it is instead."""
    if not run_dir.exists():
        raise ConfigError(f"{run_dir}: no such directory", "give the run directory to resume")
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: not a directory", "give the run directory to resume")
    if (run_dir / rundir.CONFIG_FILE).is_file():
        return
    parent = run_dir.resolve().parent
    if (
        checkpoints.CHECKPOINT_PATTERN.match(run_dir.name)
        and (parent / rundir.CONFIG_FILE).is_file()
    ):
        raise ConfigError(
            f"{run_dir} is a checkpoint, not a run directory",
            f"resume its run: {resume_command(parent)} (the newest complete checkpoint is used)",
        )
    raise ConfigError(
        f"{run_dir} is not an lmctl run directory (it has no {rundir.CONFIG_FILE})",
        "give the --output-dir of an 'lmctl train' run",
    )


def discard_unfinished_saves(run_dir: Path, console: Console) -> None:
    """Remove the leftovers of killed saves, with a warning: by the process that holds the run
    directory (see :mod:`lmctl.run.lock`), since a live run's save in progress looks the same."""
    for leftover in atomic.discard_staging(run_dir):
        console.warn(f"removed {leftover.name}: a save that did not finish")


def find_checkpoint(run_dir: Path, console: Console) -> Path:
    """The newest complete checkpoint (half-written saves are hidden folders, never taken)."""
    checkpoint = checkpoints.newest_checkpoint(run_dir, console)
    if checkpoint is None:
        objective = _saved_objective(run_dir) or "<objective>"
        unusable = len(checkpoints.checkpoints(run_dir))
        found = f" ({unusable} unusable, see the warnings)" if unusable else ""
        raise ConfigError(
            f"{run_dir} has no complete checkpoint to resume from{found}",
            "the run stopped before its first checkpoint (--save-steps); start it again with "
            + rundir.restart_command(objective, run_dir),
        )
    return checkpoint


def remote_location(path: str) -> str | None:
    """The storage URL of a remote run directory given to resume, or None for a local one.

    A ``file://`` URL names a remote run directory when lmctl uploaded it (its
    ``lmctl-manifest.json`` is there), else the local run directory at that path.
    """
    from lmctl.storage.locations import MANIFEST, run_location_problem

    if url_scheme(path) is None:
        return None
    problem = run_location_problem("RUN_DIR", path)
    if problem is not None:
        raise ConfigError(*problem)
    if not is_remote(path) and not (local_path(path) / MANIFEST).is_file():
        return None
    return path.rstrip("/")


def plan_resume(
    run_dir: Path, overrides: dict[str, Any], console: Console, location: str | None = None
) -> ResumePlan:
    """Validate everything about a resume before any heavy work. ``location``: the storage
    URL of a remote run directory whose local copy is ``run_dir``."""
    from lmctl.config.loader import build_config

    check_run_dir(run_dir)
    config_file = run_dir / rundir.CONFIG_FILE
    saved = rundir.read_config(run_dir)
    name = saved.get("objective")
    if name not in OBJECTIVES:
        raise ConfigError(
            f"{config_file}: unknown objective {name!r}",
            "this run was written by another lmctl version; known: " + ", ".join(OBJECTIVES),
        )
    objective = get_objective(name)
    checkpoint = find_checkpoint(run_dir, console)
    config = build_config(
        objective.config_class,
        cli_values={
            **overrides,
            "output_dir": location or str(run_dir),
            **({"staging_dir": str(run_dir)} if location else {}),
            "resume_from_checkpoint": str(checkpoint),
        },
        config_file=str(config_file),
        objective=name,
    )
    step = checkpoints.checkpoint_step(checkpoint)
    state = checkpoints.read_checkpoint_state(checkpoint)
    _check_there_is_more_to_do(take(LoopSpec, config), overrides, state, step, run_dir)
    launch = take(LaunchSpec, config)
    nproc = _recorded_processes(launch, "nproc" in overrides, checkpoint, console)
    if nproc is not None:
        config = config.model_copy(update={"nproc": nproc})
    batch = _same_global_batch(
        take(LaunchSpec, config),
        (take(DataSpec, config), take(ScaleSpec, config), take(LoopSpec, config)),
        checkpoint,
        console,
    )
    if batch:
        config = config.model_copy(update=batch)
    return ResumePlan(run_dir, objective, config, checkpoint, step)


def _same_global_batch(
    launch: LaunchSpec,
    run: tuple[DataSpec, ScaleSpec, LoopSpec],
    checkpoint: Path,
    console: Console,
) -> dict[str, int]:
    """On another number of processes than saved the checkpoint, the same global batch: the
    accumulation steps (or, when they cannot, the per-device batch) chosen so that
    per-device batch x processes x accumulation stays what it was; said in one line by the
    process that starts the others. What cannot continue is refused
    (``runtime.batch_on``). The fields to change, if any."""
    if distributed.launched():
        processes = distributed.world_size()
    elif launch.nnodes > 1:
        return {}
    else:
        processes = launch.nproc or 1
    new = batch_on(checkpoint, processes, run, f"--nproc {processes}")
    if new is None:
        return {}
    if run[1].deepspeed and not distributed.launched():
        # Once, in the process that starts the others, before any of them loads it.
        reshard.make_universal(checkpoint, console)
    if not distributed.launched() or (
        distributed.is_main_process() and not os.environ.get(HELD_ENV)
    ):
        saved = checkpoints.checkpoint_world_size(checkpoint)
        console.info(new.continuing(checkpoint.name, saved))
        if run[0].streaming:
            console.info(STREAM_WORLD_NOTE)
    return {
        "per_device_train_batch_size": new.per_device,
        "gradient_accumulation_steps": new.accumulation,
    }


def _recorded_processes(
    launch: LaunchSpec, nproc_given: bool, checkpoint: Path, console: Console
) -> int | None:
    """The --nproc to resume with when none is given: a run continues on as many processes as
    saved its checkpoint (each process's data order, random stream and stream position carry
    over only then), under the launcher as with --nproc. Another --nproc is refused here,
    before any process starts. Under a launcher its processes are the run's, and a run of
    several machines names its processes per machine itself (``runtime.check_world_size``
    checks both)."""
    saved = checkpoints.checkpoint_world_size(checkpoint)
    if saved is None or launch.nnodes > 1 or distributed.launched() or nproc_given:
        return None
    if saved == 1:
        return None
    console.info(f"{checkpoint.name} was saved by {saved} processes: resuming on --nproc {saved}")
    return saved


def _check_there_is_more_to_do(
    loop: LoopSpec,
    overrides: dict[str, Any],
    state: dict[str, Any],
    step: int,
    run_dir: Path,
) -> None:
    """Refuse a resume that would train no step: a finished run without a longer target."""
    extend = f"extend it with --max-steps N (more than {step})"
    if loop.max_steps is None:
        extend += " or --num-train-epochs N"
    if "max_steps" in overrides and loop.max_steps is not None and loop.max_steps <= step:
        raise ConfigError(
            f"--max-steps {loop.max_steps}: the run is already at step {step}",
            f"give more than {step} steps",
        )
    if "num_train_epochs" in overrides and loop.max_steps is not None:
        raise ConfigError(
            f"--num-train-epochs has no effect: the run is bounded by --max-steps {loop.max_steps}",
            f"extend it with --max-steps N (more than {step})",
        )
    planned = state.get("max_steps")
    if not isinstance(planned, int) or step < planned or history.finished_step(run_dir) != step:
        return
    if "max_steps" in overrides:
        return
    if "num_train_epochs" in overrides:
        before = state.get("num_train_epochs")
        if isinstance(before, (int, float)) and loop.num_train_epochs <= before:
            raise ConfigError(
                f"--num-train-epochs {loop.num_train_epochs:g}: the run already finished "
                f"{before:g} epochs",
                f"give more than {before:g} epochs",
            )
        return
    raise ConfigError(
        f"nothing to resume: the run finished at step {step} of {planned}",
        f"{extend}; or evaluate it with lmctl eval {shlex.quote(str(run_dir))}",
    )
