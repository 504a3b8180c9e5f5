"""``--nproc N``: the same command again, under torch's launcher or ``accelerate launch``.

lmctl never starts processes of its own: it builds the command line of the real launcher,
shows it, and runs it. The launched processes see the launcher's environment (``RANK``,
``WORLD_SIZE``) and run the command as one rank each. A failure is said once: the main
process prints its error, the others report theirs to the process that launched them, which
prints those that differ (:func:`report_outcome`), and the launcher's own report of a failed
process (a traceback and a table) is left out (:func:`main`). ``--nproc 1`` on one machine,
under torch's launcher and without restarts, runs in the process itself: one process needs
no launcher.

``--max-restarts N`` hands failures to torchrun's elastic agent (``accelerate launch`` runs
the same agent): when a process fails, the agent stops the others and starts every process
again, up to N times. The restarted processes continue from the newest complete checkpoint
(see :mod:`lmctl.run.restarts`). The processes then meet through torch's elastic rendezvous
(``c10d``: at ``--master-addr`` on several machines, so that the machines restart together),
in a new store after every restart (:data:`ELASTIC_ENVIRONMENT`).
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from lmctl.config.fields import flag_name
from lmctl.config.slices import LaunchSpec, field_names
from lmctl.distributed import launched, rank, restart_count
from lmctl.errors import ConfigError, Delegated, ExitCode

if TYPE_CHECKING:
    from lmctl.console import Console

#: Options that say how to launch; the launched processes get the command without them.
LAUNCH_FIELDS = field_names(LaunchSpec)
#: Where each launched process reports its exit code and error, one JSON line each, for the
#: process that launched them (see :func:`report_outcome`).
REPORT_FILE_ENV = "LMCTL_REPORT_FILE"
#: What runs the launcher (see :func:`main`).
QUIET_LAUNCHER = "lmctl.run.launch"
#: The logger of torch's elastic agent that reports each failed process, with the exit code
#: and process id, and each process it stops: lmctl's own message says what went wrong.
FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"
#: The command line the user gave (the launched processes get it without the launch options).
ARGUMENTS_ENV = "LMCTL_ARGUMENTS"
#: The port of the first machine when --nnodes is above 1 and --master-port is not given.
DEFAULT_PORT = 29500
#: With restarts: by default torch's elastic rendezvous keeps one store for every attempt,
#: with the previous attempt's addresses in it, and a restarted process may connect to one of
#: those and hang or fail (8 of 14 restarts of two CPU processes with gloo, tried on one
#: machine); this makes each attempt meet in a store of its own.
ELASTIC_ENVIRONMENT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def launcher_command(spec: LaunchSpec, arguments: list[str]) -> list[str]:
    """The launcher command that runs ``lmctl ARGUMENTS`` on ``--nproc`` processes per
    machine (``arguments`` is lmctl's own command line, without the program name)."""
    assert spec.nproc is not None
    python = sys.executable
    port = spec.master_port
    # Machines that restart together meet through the elastic rendezvous, not a fixed one.
    elastic = spec.max_restarts > 0 and spec.nnodes > 1
    if spec.launcher == "accelerate":
        command = [python, "-m", "accelerate.commands.launch"]
        command += ["--num_processes", str(spec.nproc * spec.nnodes)]
        command += ["--num_machines", str(spec.nnodes), "--machine_rank", str(spec.node_rank)]
        if spec.nproc * spec.nnodes > 1:
            command.append("--multi_gpu")
        if spec.master_addr is not None:
            command += ["--main_process_ip", spec.master_addr]
        if port is not None or spec.nnodes > 1:
            command += ["--main_process_port", str(port or DEFAULT_PORT)]
        elif spec.nproc > 1:
            # A free port on this machine (as torchrun's --standalone), not 29500, which a
            # second run on the same machine would be refused or race for.
            command += ["--main_process_port", "0"]
        if spec.max_restarts:
            command += ["--max_restarts", str(spec.max_restarts)]
        if elastic:
            command += ["--rdzv_backend", "c10d", "--rdzv_conf", _rendezvous_host(spec)]
    else:
        command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(spec.nproc)]
        if spec.nnodes == 1 and port is None:
            command.append("--standalone")  # a free port on this machine
        elif elastic:
            endpoint = f"{spec.master_addr}:{port or DEFAULT_PORT}"
            machines = f"{spec.min_nnodes}:{spec.nnodes}" if spec.min_nnodes else str(spec.nnodes)
            command += ["--nnodes", machines]
            command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint]
            command += ["--rdzv_conf", _rendezvous_host(spec)]
        else:
            command += ["--nnodes", str(spec.nnodes), "--node_rank", str(spec.node_rank)]
            command += ["--master_addr", spec.master_addr or "127.0.0.1"]
            command += ["--master_port", str(port or DEFAULT_PORT)]
        if spec.max_restarts:
            command += ["--max_restarts", str(spec.max_restarts)]
    return [*command, "-m", "lmctl", *without_launch_options(arguments)]


def _rendezvous_host(spec: LaunchSpec) -> str:
    """The machine of --node-rank 0 (at --master-addr) hosts the elastic rendezvous; torch
    would otherwise let any machine whose address matches try, several on one host too."""
    return f"is_host={int(spec.node_rank == 0)}"


def launcher_environment(spec: LaunchSpec) -> dict[str, str]:
    """The environment the launcher command needs besides its options."""
    if not spec.max_restarts:
        return {}
    if spec.launcher == "accelerate" and spec.nnodes == 1:
        # torchrun's --standalone (the elastic rendezvous on a free port of this machine),
        # which accelerate launch takes only from torchrun's environment variable.
        return {**ELASTIC_ENVIRONMENT, "PET_STANDALONE": "1"}
    return dict(ELASTIC_ENVIRONMENT)


def thread_environment(spec: LaunchSpec) -> dict[str, str]:
    """One math thread per process where several share a machine and the user set no number:
    the launchers' own default, set here so that they do not print a banner about it."""
    assert spec.nproc is not None
    if spec.nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        return {"OMP_NUM_THREADS": "1"}
    return {}


def runs_in_process(spec: LaunchSpec) -> bool:
    """``--nproc 1`` on one machine without restarts needs no launcher. ``accelerate launch``
    is still run: it also applies the user's ``accelerate config``."""
    return (
        spec.nproc == 1
        and spec.nnodes == 1
        and not spec.max_restarts
        and spec.launcher != "accelerate"
    )


def without_launch_options(arguments: list[str]) -> list[str]:
    """``arguments`` less the launch options and their values (``--nproc 2``, ``--nproc=2``)."""
    flags = {flag_name(name) for name in LAUNCH_FIELDS}
    kept: list[str] = []
    skip = False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in flags:
            skip = True
        elif argument.split("=", 1)[0] not in flags:
            kept.append(argument)
    return kept


def user_arguments() -> list[str]:
    """lmctl's command line as the user gave it, without the program name: in a process that
    :func:`relaunch` started, with the launch options it leaves out of the processes'."""
    given = os.environ.get(ARGUMENTS_ENV)
    if given is not None and launched():
        return shlex.split(given)
    return sys.argv[1:]


def relaunch(spec: LaunchSpec, console: Console) -> None:
    """With ``--nproc``, outside a launcher: show the launcher command, run it, say the errors
    of the other processes that the main one did not say, and pass on the exit code of the
    first process that failed (a launcher exits 1 whenever a process fails, whatever for) by
    raising :class:`Delegated`."""
    if spec.nproc is None or launched() or runs_in_process(spec):
        return
    command = launcher_command(spec, sys.argv[1:])
    environment = {**launcher_environment(spec), **thread_environment(spec)}
    shown = [f"{name}={value}" for name, value in environment.items()]
    console.info("running: " + shlex.join([*shown, *command]))
    sys.stdout.flush()
    sys.stderr.flush()
    python, _, module, *arguments = command
    handle, report_file = tempfile.mkstemp(prefix="lmctl-report-")
    os.close(handle)
    try:
        try:
            # The launched run writes its result to lmctl's own stdout (this process has sent
            # file descriptor 1 to stderr meanwhile, see lmctl.console.own_stdout).
            launcher = subprocess.Popen(
                [python, "-m", QUIET_LAUNCHER, module, *arguments],
                env={
                    **os.environ,
                    **environment,
                    REPORT_FILE_ENV: report_file,
                    ARGUMENTS_ENV: shlex.join(sys.argv[1:]),
                },
                stdout=_result_stream(console),
            )
        except OSError as exc:
            raise ConfigError(
                f"--nproc {spec.nproc}: cannot start the launcher ({exc})",
                "run the command above yourself",
            ) from exc
        # SIGTERM to this process goes on to the launcher, which passes it to every process;
        # Ctrl-C reaches them all from the terminal already.
        previous = signal.signal(signal.SIGTERM, lambda *_: launcher.send_signal(signal.SIGTERM))
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = launcher.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, interrupt)
        reports = read_reports(Path(report_file))
    finally:
        Path(report_file).unlink(missing_ok=True)
    for message, hint in errors_to_say(reports):
        console.error(message, hint)
    raise Delegated(outcome(reports, code))


def collects_errors() -> bool:
    """Whether the process that launched this one says this process's error (see
    :func:`report_outcome`)."""
    return REPORT_FILE_ENV in os.environ


def report_outcome(code: int, error: dict[str, Any] | None) -> None:
    """In a process of a run started by :func:`relaunch`: report its exit code and the error
    it stops with (``error``, ``hint``, and ``said``: whether it printed it itself)."""
    report_file = os.environ.get(REPORT_FILE_ENV)
    if not report_file:
        return
    record = {"rank": rank(), "attempt": restart_count(), "exit_code": int(code), **(error or {})}
    with suppress(OSError), open(report_file, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def read_reports(report_file: Path) -> list[dict[str, Any]]:
    """The reports of the launched processes, in the order they were made."""
    reports = []
    with suppress(OSError):
        for line in report_file.read_text(encoding="utf-8").splitlines():
            with suppress(ValueError):
                reports.append(json.loads(line))
    return reports


def outcome(reports: list[dict[str, Any]], launcher_code: int) -> int:
    """The run's exit code, from the reports of its last attempt: the first failure's, where
    the interruptions of the processes the launcher stopped because of it do not count; 0
    when they all succeeded; the launcher's when none reported (a process that crashed)."""
    if not reports:
        return launcher_code
    last = max(report["attempt"] for report in reports)
    failed = [r["exit_code"] for r in reports if r["attempt"] == last and r["exit_code"]]
    return next(
        (code for code in failed if code != ExitCode.INTERRUPTED), failed[0] if failed else 0
    )


def errors_to_say(reports: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """The errors that the processes left to the process that launched them: each once, none
    that a process said itself, and no interruption of a process that the launcher stopped
    because another one failed (or to restart them all)."""
    said = {(r["error"], r["hint"]) for r in reports if r.get("said")}
    failed = {r["attempt"] for r in reports if r["exit_code"] not in (0, ExitCode.INTERRUPTED)}
    last = max((r["attempt"] for r in reports), default=0)
    errors: list[tuple[str, str | None]] = []
    for report in reports:
        if "error" not in report or report["said"]:
            continue
        error = (str(report["error"]), report["hint"])
        stopped = report["exit_code"] == ExitCode.INTERRUPTED and (
            report["attempt"] in failed or report["attempt"] < last
        )
        if error not in said and not stopped:
            said.add(error)
            errors.append(error)
    return errors


def main(argv: list[str]) -> NoReturn:
    """``python -m lmctl.run.launch MODULE ARGUMENTS``: run a launcher as ``python -m MODULE
    ARGUMENTS`` does, without its report of a failed process (a traceback of its own code and
    a table of exit codes and process ids), and exit with the failed process's exit code.
    lmctl's processes say what went wrong themselves; a process killed by a signal, which
    could not, is named in one line."""
    import logging
    import runpy

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    module, *arguments = argv
    sys.argv = [module, *arguments]
    logging.getLogger(FAILURE_LOGGER).setLevel(logging.CRITICAL)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except ChildFailedError as exc:
        failed_rank, failure = exc.get_first_failure()
        if failure.exitcode >= 0:
            sys.exit(failure.exitcode)
        from lmctl.console import Console

        Console().error(
            f"the process of rank {failed_rank} was killed by "
            f"{signal.Signals(-failure.exitcode).name}",
            "something outside lmctl stopped it (the kernel's out-of-memory killer sends "
            "SIGKILL): see the machine's logs",
        )
        sys.exit(128 - failure.exitcode)
    except SignalException as exc:  # the launcher was stopped, and stopped its processes
        sys.exit(128 + int(exc.sigval))
    sys.exit(0)


def end_launched_process(code: int) -> NoReturn:
    """End a process a launcher started, once its command has finished and reported.

    Everything Python's own exit does for the program runs first: other threads are waited
    for, exit handlers run (logging, trackers, worker processes), stdout and stderr are
    flushed. Then the process ends without interpreter shutdown. That shutdown destroys
    torch's native objects (thread pools, the rendezvous store's client) in an order that now
    and then aborts a process after a run that succeeded ("terminate called without an active
    exception"); the launcher then stops the other processes and reports the run as failed.
    """
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(int(code))


def _result_stream(console: Console) -> Any:
    """The stream lmctl writes its result to, when it is a real file (else inherit stdout)."""
    try:
        console.out.fileno()  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return None
    return console.out


if __name__ == "__main__":
    main(sys.argv[1:])
