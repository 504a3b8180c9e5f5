"""The benchmark suite: lmctl against the upstream recipe, every figure side by side.

    python benchmarks/run.py            # the full suite, writes docs/benchmarks.md
    python benchmarks/run.py --quick    # a smoke run of every section (small sizes, 1 rep)

The baseline is the upstream example scripts' recipe as a user runs it (see
``benchmarks/upstream.py``). Each figure is measured ``--reps`` times with lmctl and the
baseline alternating (A B A B ...), and reported as min / median / max; ratios are of medians.
Models are initialised once and saved, so both sides start from the same weights.

The suite's parts: ``figures.py`` (a figure of both sides, alternating runs, the page),
``workload.py`` (generated text, saved models, the machine, the baseline's runs), the sections
(``preparation.py``: start-up, preprocessing; ``training.py``: training, MFU; ``lifecycle.py``:
evaluation, resume, remote, end to end; ``mixture.py``: a mixture of named sources), and
``grid.py`` and ``grid_page.py`` (``--grid``).
This file is the command line: it runs the sections chosen, in order or in groups of
processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Everything is local: no library may wait on the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.figures import GROUPS, Figure, render  # noqa: E402
from benchmarks.grid import REPEAT_SEED, Cell, run_grid  # noqa: E402
from benchmarks.grid_page import grid_block, render_grid, splice  # noqa: E402
from benchmarks.lifecycle import end_to_end, evaluation, remote, resume  # noqa: E402
from benchmarks.mixture import mixture  # noqa: E402
from benchmarks.preparation import preprocessing, startup  # noqa: E402
from benchmarks.training import mfu, training  # noqa: E402
from benchmarks.workload import Work, machine_info  # noqa: E402


def _parallel(args: argparse.Namespace, sections: set[str]) -> list[Figure]:
    """Each group of sections in its own process, all at once; their figures, in order."""
    forwarded = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in vars(args).items()
        if key in ("reps", "train_reps", "corpus_mb", "train_steps", "eval_mb", "resume_blocks")
        and value
    ] + (["--quick"] if args.quick else [])
    jobs = []
    scratch = Path(tempfile.mkdtemp(prefix="lmctl-bench-groups-"))
    for index, group in enumerate(GROUPS):
        wanted = [name for name in group if name in sections or name.split(":")[0] in sections]
        if not wanted:
            continue
        out = scratch / f"group-{index}.json"
        command = [
            sys.executable,
            __file__,
            *forwarded,
            "--sections",
            ",".join(wanted),
            "--output",
            str(scratch / f"group-{index}.md"),
            "--figures-out",
            str(out),
        ]
        jobs.append((subprocess.Popen(command), out))
    figures = []
    for process, out in jobs:
        if process.wait() != 0:
            raise SystemExit(f"a group of sections failed: {process.args}")
        figures += [Figure(**item) for item in json.loads(out.read_text())]
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


def _keep_grid(output: str, page: str) -> str:
    """The suite's page with the grid section that ``output`` already has (measured apart)."""
    path = Path(output)
    block = grid_block(path.read_text(encoding="utf-8")) if path.exists() else ""
    return splice(page, block) if block else page


def _grid(args: argparse.Namespace) -> int:
    """Run the grid and write its section into the page, the rest of the page kept."""
    root = Path(tempfile.mkdtemp(prefix="lmctl-grid-"))
    try:
        work = Work(root, quick=False)
        machine = machine_info()
        keep = Path(args.grid_keep) if args.grid_keep else None
        outcomes, minutes, reused = run_grid(
            work, args.grid_cells, args.quick, keep, args.grid_seed
        )
        block = render_grid(outcomes, minutes, machine, reused)
        output = Path(args.output)
        page = output.read_text(encoding="utf-8") if output.exists() else "# Benchmarks\n"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(splice(page, block), encoding="utf-8")
        print(block)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3; quick 1)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--sections",
        default="startup,preprocessing,training,mfu,evaluation,resume,remote,end-to-end,mixture",
    )
    parser.add_argument("--shared", action="store_true", help="note that the machine was shared")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run three groups of sections as concurrent processes (a loaded machine)",
    )
    parser.add_argument("--figures-out", help=argparse.SUPPRESS)
    parser.add_argument("--train-reps", type=int, help="repetitions of training runs")
    parser.add_argument(
        "--combine",
        nargs="+",
        help="write the page from figure files of separate --figures-out runs (no measuring)",
    )
    parser.add_argument("--corpus-mb", type=float, help="preprocessing corpus (default 64)")
    parser.add_argument("--train-steps", type=int, help="steps per training run (default 40)")
    parser.add_argument("--eval-mb", type=float, help="evaluation text (default 0.5)")
    parser.add_argument("--resume-blocks", help="two block counts (default 10000,100000)")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="time to quality on the workload grid (about 35 minutes); writes its section only",
    )
    parser.add_argument("--grid-cells", help="only the grid cells whose name has this text")
    parser.add_argument(
        "--grid-keep", help="JSON-lines file of measured cells: a stopped --grid run continues"
    )
    parser.add_argument(
        "--grid-seed",
        type=int,
        help=f"run each grid cell once at this seed on both sides (default: {Cell.seed}, "
        f"three again at {REPEAT_SEED})",
    )
    args = parser.parse_args()
    if args.grid:
        return _grid(args)
    args.reps = args.reps or (1 if args.quick else 3)
    sections = set(args.sections.split(","))
    if args.combine:
        figures = [
            Figure(**item) for path in args.combine for item in json.loads(Path(path).read_text())
        ]
        machine = machine_info()
        minutes = float(os.environ.get("LMCTL_BENCH_MINUTES", "0"))
        text = _keep_grid(args.output, render(figures, machine, args, minutes))
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
        print(text)
        return 0
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="lmctl-bench-"))
    try:
        work = Work(root, args.quick)
        machine = machine_info()
        figures: list[Figure] = []
        reps = args.reps

        timings: dict[str, float] = {}

        def write() -> str:
            """The page so far (rewritten after every section, so a stopped run keeps it)."""
            minutes = (time.perf_counter() - started) / 60
            text = _keep_grid(args.output, render(figures, machine, args, minutes, timings))
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(text, encoding="utf-8")
            return text

        def section(name: str, function: Callable[[], list[Figure]]) -> None:
            if name in sections:
                begun = time.perf_counter()
                print(f"[{begun - started:6.0f} s] {name}", file=sys.stderr)
                figures.extend(function())
                timings[name] = (time.perf_counter() - begun) / 60
                write()

        sizes = {
            "corpus_mb": args.corpus_mb or (1 if args.quick else 64),
            "train_steps": args.train_steps or (2 if args.quick else 40),
            "eval_mb": args.eval_mb or (0.02 if args.quick else 0.5),
            "resume_blocks": tuple(
                int(n)
                for n in (
                    args.resume_blocks or ("100,1000" if args.quick else "10000,100000")
                ).split(",")
            ),
        }
        machine["sizes"] = ", ".join(f"{k} {v}" for k, v in sizes.items())
        if args.parallel:
            figures.extend(_parallel(args, sections))
            sections = set()
        section("startup", lambda: startup(work, reps))
        section("preprocessing", lambda: preprocessing(work, reps, sizes["corpus_mb"]))
        clm: dict[str, Any] = {}
        objectives: set[str] = set()
        for name in sections:
            if name == "training" or (name == "mfu" and "training" not in sections):
                objectives |= {"clm", "mlm", "swag"} if name == "training" else {"clm"}
            elif name.startswith("training:"):
                objectives |= set(name.split(":", 1)[1].split("+"))
        if objectives:
            begun = time.perf_counter()
            print(f"[{begun - started:6.0f} s] training", file=sys.stderr)
            trained, clm = training(work, args.train_reps or reps, sizes["train_steps"], objectives)
            figures.extend(trained)
            timings["training"] = (time.perf_counter() - begun) / 60
            write()
        if clm.get("clm"):
            section(
                "mfu", lambda: mfu(work, clm, args.train_reps or reps, 0.5 if args.quick else 3)
            )
        section("evaluation", lambda: evaluation(work, reps, sizes["eval_mb"]))
        section("resume", lambda: resume(work, reps, sizes["resume_blocks"]))
        section("remote", lambda: remote(work, args.train_reps or reps, sizes["train_steps"]))
        section(
            "end-to-end", lambda: end_to_end(work, 1 if args.quick else args.train_reps or reps)
        )
        section("mixture", lambda: mixture(work, args.train_reps or reps, sizes["train_steps"]))
        text = write()
        if args.figures_out:
            Path(args.figures_out).write_text(json.dumps([asdict(f) for f in figures]))
        else:
            print(text)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
