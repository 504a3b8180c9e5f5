"""``--nproc N``: the same command again, under torch's launcher or ``accelerate launch``.

lmctl never starts processes of its own: it builds the command line of the real launcher,
shows it, and replaces itself with it. The launched processes see the launcher's
environment (``RANK``, ``WORLD_SIZE``) and run the command as one rank each.

``--max-restarts N`` hands failures to torchrun's elastic agent (``accelerate launch`` runs
the same agent): when a process fails, the agent stops the others and starts every process
again, up to N times. The restarted processes continue from the newest complete checkpoint
(see :mod:`lmctl.run.restarts`). The processes then meet through torch's elastic rendezvous
(``c10d``: at ``--master-addr`` on several machines, so that the machines restart together),
in a new store after every restart (:data:`ELASTIC_ENVIRONMENT`).
"""

from __future__ import annotations

import atexit
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
from lmctl.distributed import is_main_process, launched
from lmctl.errors import ConfigError, Delegated

if TYPE_CHECKING:
    from lmctl.console import Console

#: Options that say how to launch; the launched processes get the command without them.
LAUNCH_FIELDS = field_names(LaunchSpec)
#: Where the launched main process writes its exit code for the process that launched it.
EXIT_FILE_ENV = "LMCTL_EXIT_FILE"
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
            command += ["--nnodes", str(spec.nnodes)]
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
    """With ``--nproc``, outside a launcher: show the launcher command, run it, and pass on
    the exit code of the run's main process (a launcher exits 1 whenever a process fails,
    whatever for) by raising :class:`Delegated`."""
    if spec.nproc is None or launched():
        return
    command = launcher_command(spec, sys.argv[1:])
    environment = launcher_environment(spec)
    shown = [f"{name}={value}" for name, value in environment.items()]
    console.info("running: " + shlex.join([*shown, *command]))
    sys.stdout.flush()
    sys.stderr.flush()
    handle, exit_file = tempfile.mkstemp(prefix="lmctl-exit-")
    os.close(handle)
    try:
        try:
            # The launched run writes its result to lmctl's own stdout (this process has sent
            # file descriptor 1 to stderr meanwhile, see lmctl.console.own_stdout).
            launcher = subprocess.Popen(
                command,
                env={
                    **os.environ,
                    **environment,
                    EXIT_FILE_ENV: exit_file,
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
        reported = Path(exit_file).read_text().strip()
    finally:
        Path(exit_file).unlink(missing_ok=True)
    raise Delegated(int(reported) if reported.isdigit() else code)


def report_exit_code(code: int) -> None:
    """In the main process of a run started by :func:`relaunch`: record its exit code."""
    exit_file = os.environ.get(EXIT_FILE_ENV)
    if exit_file and is_main_process():
        with suppress(OSError):
            Path(exit_file).write_text(f"{int(code)}\n")


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
