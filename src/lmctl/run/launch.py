"""``--nproc N``: the same command again, under torch's launcher or ``accelerate launch``.

lmctl never starts processes of its own: it builds the command line of the real launcher,
shows it, and replaces itself with it. The launched processes see the launcher's
environment (``RANK``, ``WORLD_SIZE``) and run the command as one rank each.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING

from lmctl.config.fields import flag_name
from lmctl.distributed import launched
from lmctl.errors import ConfigError

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console

#: Options that say how to launch; the launched processes get the command without them.
LAUNCH_FIELDS = ("nproc", "nnodes", "node_rank", "master_addr", "master_port", "launcher")
#: The port of the first machine when --nnodes is above 1 and --master-port is not given.
DEFAULT_PORT = 29500


def launcher_command(config: TrainConfig, arguments: list[str]) -> list[str]:
    """The launcher command that runs ``lmctl ARGUMENTS`` on ``config.nproc`` processes per
    machine (``arguments`` is lmctl's own command line, without the program name)."""
    assert config.nproc is not None
    python = sys.executable
    port = config.master_port
    if config.launcher == "accelerate":
        command = [python, "-m", "accelerate.commands.launch"]
        command += ["--num_processes", str(config.nproc * config.nnodes)]
        command += ["--num_machines", str(config.nnodes), "--machine_rank", str(config.node_rank)]
        if config.nproc * config.nnodes > 1:
            command.append("--multi_gpu")
        if config.master_addr is not None:
            command += ["--main_process_ip", config.master_addr]
        if port is not None or config.nnodes > 1:
            command += ["--main_process_port", str(port or DEFAULT_PORT)]
    else:
        command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(config.nproc)]
        if config.nnodes == 1 and port is None:
            command.append("--standalone")  # a free port on this machine
        else:
            command += ["--nnodes", str(config.nnodes), "--node_rank", str(config.node_rank)]
            command += ["--master_addr", config.master_addr or "127.0.0.1"]
            command += ["--master_port", str(port or DEFAULT_PORT)]
    return [*command, "-m", "lmctl", *without_launch_options(arguments)]


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


def relaunch(config: TrainConfig, console: Console) -> None:
    """With ``--nproc``, outside a launcher: show the launcher command and become it."""
    if config.nproc is None or launched():
        return
    command = launcher_command(config, sys.argv[1:])
    console.info("running: " + shlex.join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(command[0], command)
    except OSError as exc:
        raise ConfigError(
            f"--nproc {config.nproc}: cannot start the launcher ({exc})",
            "run the command above yourself",
        ) from exc
