"""Training speed on one CUDA GPU, with lmctl's fast paths on and off.

GPT-2 124M (clm) and BERT-base (mlm), built from their default configs with random weights,
train in bf16 on synthetic tokens: words drawn uniformly from the whole vocabulary, through a
word-level tokenizer the size of the model's vocabulary (GPT-2's 50,257, BERT's 30,522).
Each model trains on both engines with every fast path named (``--fast-paths`` listing them
all, on whatever device) and with ``--fast-paths off``; then GPT-2 once under FSDP version 1
and once under version 2, and once under DeepSpeed ZeRO-2 with DeepSpeed's fused Adam, each
in one process (torchrun), on the trainer engine. Every run is a fresh ``lmctl train``
process. Per run: tokens/s between the first and the last logged step (start-up, the first
steps' allocations and any compilation left out), MFU (6N + 12 L T d FLOP per token over the
GPU's datasheet dense bf16 peak, stated on the page), the peak of the GPU memory allocated,
and the last logged loss. It writes ``docs/benchmarks-gpu.md``, in under 8 minutes on one
H100-class GPU (``--budget-minutes`` stops starting runs after that).

    python benchmarks/device.py                      # one CUDA GPU: writes the page
    python benchmarks/device.py --dry-run            # the runs and their commands
    python benchmarks/device.py --smoke --output /tmp/gpu.md   # tiny models, any device

The runs, their inputs and command lines are in ``device_runs.py``; MFU's terms and the page
in ``device_page.py``. This file is the command line and measures: one process per run, this
script again with ``--one-run`` (under torchrun when sharded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: benchmarks/ is a package of the checkout
    sys.path.insert(0, str(ROOT))
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from benchmarks.common import lmctl_env  # noqa: E402
from benchmarks.device_page import (  # noqa: E402
    bf16_peak,
    cell,
    flops_per_token,
    machine,
    matmul_tflops,
    render,
)
from benchmarks.device_runs import Result, Run, lmctl_arguments, plan, write_inputs  # noqa: E402

#: Per-run wall-clock limit: a run past it is recorded as failed.
RUN_TIMEOUT = 180


# Measuring ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(run: Run, work: Path, args: argparse.Namespace) -> Result:
    """One ``lmctl train`` process (under torchrun when sharded), read back from its run
    directory's metrics and the peak memory it reported."""
    write_inputs(work, run, args.steps)
    run_dir = work / "runs" / run.label
    report = work / "runs" / f"{run.label}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    arguments = lmctl_arguments(run, work, run_dir, args)
    inner = [str(Path(__file__).resolve()), "--one-run", str(report), "--", *arguments]
    if run.sharding is None:
        command = [sys.executable, *inner]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
            "--master_port", str(_free_port()), *inner,
        ]  # fmt: skip
    env = lmctl_env(LMCTL_CACHE=str(work / "cache"))
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return Result(run, note=f"failed: over {RUN_TIMEOUT} s")
    if args.log_file:
        with Path(args.log_file).open("a", encoding="utf-8") as handle:
            tail = "\n".join(done.stderr.splitlines()[-40:])
            handle.write(f"=== {run.label} (exit {done.returncode})\n{tail}\n")
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return Result(run, note=f"failed (exit {done.returncode}): {lines[-1] if lines else ''}")
    reported = json.loads(report.read_text()) if report.is_file() else {}
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    result = Result(run, peak_memory=reported.get("peak_memory"))
    result.note = fast_path_line(done.stderr)
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        tokens = (last["step"] - first["step"]) * run.model.batch * run.model.length
        result.tokens_per_second = tokens / max(last["time"] - first["time"], 1e-9)
        result.loss = float(last["loss"])
    else:
        result.note = f"fewer than two logged steps (--steps {args.steps})"
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def fast_path_line(stderr: str) -> str:
    """What lmctl's log said was on (the part after ``on:``, up to the paths that were off)."""
    for line in stderr.splitlines():
        if "fast paths (" in line:
            said = line.split("): ", 1)[-1]
            on = said.split("off: ", 1)[0].rstrip("; ")
            return on if on.startswith("on: ") else "none on"
    return ""


def one_run(report: Path, arguments: list[str]) -> int:
    """Run lmctl in this process, then write its exit code and the peak memory it took (the
    GPU memory allocated on CUDA, else the process's peak RSS)."""
    import resource

    import torch

    from lmctl.cli.app import main

    sys.argv = ["lmctl", *arguments]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if torch.cuda.is_available():
        peak = int(torch.cuda.max_memory_allocated())
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if int(os.environ.get("RANK", "0")) == 0:
        report.write_text(json.dumps({"exit_code": code, "peak_memory": peak}), encoding="utf-8")
    return code


# Command line ---------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks-gpu.md"))
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    parser.add_argument(
        "--log-every", type=int, default=10, help="steps between logged losses (default 10)"
    )
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "fp16"])
    parser.add_argument("--only", help="comma-separated run labels (see --dry-run)")
    parser.add_argument("--log-file", help="append the end of each run's log to this file")
    parser.add_argument(
        "--peak-tflops", type=float, help="the GPU's bf16 peak, for a GPU not in the table"
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=8.0,
        help="start no run after this many minutes (default 8)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny models, any device (a check of the benchmark, not a measurement)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the runs; run nothing")
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.log_every >= args.steps:
        parser.error("--log-every must be below --steps: tokens/s is taken between logs")
    return args


def selected(args: argparse.Namespace) -> list[Run]:
    runs = plan(args.smoke)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {run.label for run in runs}
        if unknown:
            raise SystemExit(
                f"--only: no run named {', '.join(sorted(unknown))}; "
                f"the runs: {', '.join(run.label for run in runs)}"
            )
        runs = [run for run in runs if run.label in wanted]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one_run:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        return one_run(Path(args.one_run), rest)
    runs = selected(args)
    if args.dry_run:
        for run in runs:
            arguments = lmctl_arguments(run, Path("WORK"), Path("WORK/runs") / run.label, args)
            launcher = "torchrun --nproc_per_node 1 -m " if run.sharding else "python -m "
            print(f"{run.label}: {launcher}lmctl {' '.join(arguments)}")
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        print(
            "benchmarks/device.py measures a CUDA GPU and this machine has none; run it on "
            "one, or check the benchmark itself with --smoke",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lmctl-device-"))
    try:
        info = machine(device)
        matmul = matmul_tflops(device)
        if device == "cuda":
            peak = bf16_peak(info["device"], args.peak_tflops)
        else:
            peak = (matmul, "the measured bf16 matmul: no GPU, a check of the benchmark only")
        results: list[Result] = []
        for run in runs:
            if time.monotonic() - started > args.budget_minutes * 60:
                results.append(Result(run, note=f"not run: past {args.budget_minutes} minutes"))
                continue
            result = measure(run, work, args)
            result.flops_per_token = flops_per_token(run.model)[1]
            results.append(result)
            print(
                f"{run.label}: {cell(result.tokens_per_second, ',.0f')} tokens/s {result.note}",
                file=sys.stderr,
            )
            # The page so far, after every run: a run cut short still leaves its figures.
            minutes = (time.monotonic() - started) / 60
            text = render(results, info, peak=peak, matmul=matmul, minutes=minutes, args=args)
            write_page(Path(args.output), text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    text = render(results, info, peak=peak, matmul=matmul, minutes=minutes, args=args)
    write_page(Path(args.output), text)
    print(text)
    return 0


def write_page(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
