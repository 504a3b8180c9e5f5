"""The suite's sections past training: evaluation (throughput and memory), resume of a
streamed run, a run written to remote storage, and the README's first command end to end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import run_lmctl
from benchmarks.figures import Figure, interleave
from benchmarks.workload import Work, run_upstream, write_text_of_size


def evaluation(work: Work, reps: int, megabytes: float) -> list[Figure]:
    """clm eval with a 50,257-entry vocabulary: throughput, peak RSS, RSS growth."""
    model = work.model(
        "gpt2-2x128-50k",
        "gpt2",
        vocab_size=50257,
        n_layer=2,
        n_embd=128,
        n_head=2,
        n_positions=128,
    )
    valid = write_text_of_size(work.root / "valid.txt", megabytes, seed=7)
    tiny = write_text_of_size(work.root / "valid-tiny.txt", 0.002, seed=8)

    def lmctl_side(data: Path) -> dict[str, Any]:
        out = work.fresh("eval").with_suffix(".json")
        _, elapsed, peak = run_lmctl(
            [
                "eval",
                model,
                "--task",
                "clm",
                "--validation-file",
                data,
                "--block-size",
                128,
                "--per-device-eval-batch-size",
                8,
                "--output",
                out,
                "--no-progress",
            ],
            work.env(),
            sample_memory=True,
        )
        results: dict[str, Any] = json.loads(out.read_text())
        results.update(wall=elapsed, peak_rss=peak)
        return results

    def baseline_side(data: Path) -> dict[str, Any]:
        return run_upstream(
            work,
            [
                "eval-clm",
                "--model",
                str(model),
                "--validation-file",
                str(data),
                "--block-size",
                "128",
                "--batch-size",
                "8",
            ],
            memory=True,
        )

    # The loaded model's peak is measured as often as the evaluation's: one sample of it is
    # as noisy as the growth of a streaming evaluation is small.
    loaded = interleave(
        reps, {"lmctl": lambda: lmctl_side(tiny), "baseline": lambda: baseline_side(tiny)}
    )
    runs = interleave(
        reps, {"lmctl": lambda: lmctl_side(valid), "baseline": lambda: baseline_side(valid)}
    )
    mib = 2**20

    def growth(side: str) -> list[float]:
        base = statistics.median(r["peak_rss"] for r in loaded[side])
        return [(r["peak_rss"] - base) / mib for r in runs[side]]

    return [
        Figure(
            "evaluation",
            f"clm eval, 50,257 vocab, {megabytes} MB, batch 8",
            "samples/s",
            [r["eval_samples_per_second"] for r in runs["lmctl"]],
            [r["eval_samples_per_second"] for r in runs["baseline"]],
            "higher",
            1.5,
        ),
        Figure(
            "evaluation",
            "peak RSS",
            "MiB",
            [r["peak_rss"] / mib for r in runs["lmctl"]],
            [r["peak_rss"] / mib for r in runs["baseline"]],
            "lower",
            1.0,
        ),
        Figure(
            "evaluation",
            "RSS growth during evaluation",
            "MiB",
            growth("lmctl"),
            growth("baseline"),
            "lower",
            2.0,
            "peak minus the median peak of the same command on a one-block file (the loaded "
            "model); at or below zero: no growth measurable above it",
        ),
        Figure(
            "evaluation",
            "eval_loss (lmctl / baseline)",
            "loss",
            [r["eval_loss"] for r in runs["lmctl"]],
            [r["eval_loss"] for r in runs["baseline"]],
            "lower",
            None,
        ),
    ]


def resume(work: Work, reps: int, blocks: tuple[int, int]) -> list[Figure]:
    """Wall time of 'lmctl resume' to the first new step, stopped after N streamed blocks."""
    model = work.model(
        "gpt2-1x64", "gpt2", vocab_size=30522, n_layer=1, n_embd=64, n_head=2, n_positions=64
    )
    block, batch = 64, 8
    megabytes = max(blocks) * block * 5.5 / 2**20
    data = write_text_of_size(work.root / "stream.txt", megabytes, seed=11)
    figures = []
    walls: dict[int, list[float]] = {}
    template = work.fresh("stream-run")
    run_lmctl(
        [
            "train",
            "clm",
            "--model",
            model,
            "--train-file",
            data,
            "--streaming",
            "--block-size",
            block,
            "--per-device-train-batch-size",
            batch,
            "--max-steps",
            1,
            "--no-eval",
            "--save-steps",
            1,
            "--shuffle-buffer-size",
            1000,
            "-o",
            template,
            "--no-progress",
        ],
        work.env(),
    )

    positions = {
        count: _stream_position_after(model, data, block, batch, count) for count in blocks
    }

    def at(count: int) -> float:
        run = work.fresh("stream-resume")
        shutil.copytree(template, run)
        for checkpoint in run.glob("checkpoint-*"):
            position = checkpoint / "stream_position.json"
            # The position a run stopped after ``count`` blocks records, with its size in the
            # checkpoint's manifest (resume refuses a file that does not match).
            position.write_text(json.dumps(positions[count]) + "\n")
            manifest = checkpoint / "lmctl_checkpoint.json"
            listing = json.loads(manifest.read_text())
            listing["files"][position.name] = position.stat().st_size
            manifest.write_text(json.dumps(listing, indent=1) + "\n")
        env = work.env()
        started = time.perf_counter()
        run_lmctl(["resume", run, "--max-steps", 2, "--no-progress"], env)
        return time.perf_counter() - started

    runs = interleave(reps, {str(count): lambda count=count: at(count) for count in blocks})
    for count in blocks:
        walls[count] = runs[str(count)]
    small, large = blocks
    figures.append(Figure("resume", f"resume after {small:,} streamed blocks", "s", walls[small]))
    figures.append(
        Figure(
            "resume",
            f"resume after {large:,} streamed blocks (ratio: {small:,} / {large:,})",
            "s",
            walls[large],
            walls[small],
            "lower",
            1 / 1.2,
            "target: within 1.2x of the small one",
        )
    )
    return figures


def _stream_position_after(
    model: Path, data: Path, block: int, batch: int, count: int
) -> dict[str, Any]:
    """The stream position that a run of ``resume()``'s settings (one process, no dataloader
    workers) records after training on ``count`` blocks: read the same stream that far, batch
    by batch, through lmctl's own cursor."""
    import torch
    from transformers import AutoTokenizer

    from lmctl.config.loader import build_config
    from lmctl.config.slices import Access, DataSpec, take
    from lmctl.console import Console, OutputOptions
    from lmctl.data import stream
    from lmctl.data.stream.positions import POSITION_COLUMN, stream_cursor, strip_positions
    from lmctl.data.stream.sources import Readers, load_sources
    from lmctl.distributed import world_size
    from lmctl.objectives.clm import ClmConfig

    config = build_config(
        ClmConfig,
        cli_values={
            "train_file": str(data),
            "model_name_or_path": str(model),
            "streaming": True,
            "block_size": block,
            "per_device_train_batch_size": batch,
            "max_steps": 1,
            "do_eval": False,
            "shuffle_buffer_size": 1000,
        },
    )
    spec = take(DataSpec, config)
    sources = load_sources(
        spec,
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    console = Console(OutputOptions(quiet=True))
    train = stream.block_streams(spec, sources, tokenizer, block, console, seed=config.seed)[
        "train"
    ]
    cursor = stream_cursor(train)
    assert cursor is not None
    cursor.begin_pass(0)
    examples = iter(train)
    for _ in range(count // batch):
        features = [next(examples) for _ in range(batch)]
        _, mark, _ = strip_positions(features)
        cursor.take({POSITION_COLUMN: torch.tensor([mark])})
    return {"epoch": 0, "batches": count // batch, "rank": 0, "readers": cursor.state()}


@contextlib.contextmanager
def s3_endpoint() -> Any:
    """An S3 endpoint on loopback (moto's server, a development dependency) with one bucket:
    the environment that points lmctl at it, or None without moto."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        client.create_bucket(Bucket="runs")
        yield env
    finally:
        server.stop()


def remote(work: Work, reps: int, steps: int) -> list[Figure]:
    """train_runtime of one run written to a local run directory and of the same run written
    to a storage URL (file://, and s3:// on a loopback endpoint where moto is installed): a
    checkpoint every quarter of the run, two kept, each uploaded beside training."""
    model = work.model(
        "gpt2-4x256", "gpt2", vocab_size=30522, n_layer=4, n_embd=256, n_head=4, n_positions=128
    )
    data = write_text_of_size(work.root / "remote.txt", 2, seed=13)
    every = max(1, steps // 4)
    common = [
        "train", "clm", "--model", model, "--train-file", data, "--block-size", 128,
        "--per-device-train-batch-size", 8, "--max-steps", steps, "--save-steps", every,
        "--save-total-limit", 2, "--no-eval", "--no-progress",
    ]  # fmt: skip

    def runtime(destination: str, env: dict[str, str]) -> float:
        staging = work.fresh("staging")
        extra = [] if destination.startswith("/") else ["--staging-dir", staging]
        done, _, _ = run_lmctl([*common, "-o", destination, *extra], env)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"lmctl train -o {destination} exited {done.returncode}")
        folder = staging if extra else Path(destination)
        results = json.loads((folder / "all_results.json").read_text())
        shutil.rmtree(staging, ignore_errors=True)
        return float(results["train_runtime"])

    figures = []
    with s3_endpoint() as s3_env:
        sides: dict[str, Callable[[], float]] = {
            "local": lambda: runtime(str(work.fresh("local-run")), work.env()),
            "file": lambda: runtime(f"file://{work.fresh('file-run')}", work.env()),
        }
        if s3_env is not None:
            sides["s3"] = lambda: runtime(
                f"s3://runs/{work.fresh('s3-run').name}", work.env(**s3_env)
            )
        runs = interleave(reps, sides)
    for name, label in (("file", "file://"), ("s3", "s3:// (loopback endpoint)")):
        if name in runs:
            figures.append(
                Figure(
                    "remote",
                    f"train clm to {label}, {steps} steps, a checkpoint every {every} "
                    "(baseline: the same run to a local directory; ratio: its time over it)",
                    "s",
                    runs[name],
                    runs["local"],
                    "lower",
                    1 / 1.05,
                    "target: within 5% of the local run's train_runtime",
                )
            )
    return figures


def end_to_end(work: Work, reps: int) -> list[Figure]:
    """The README's first command; --quick stops it after 5 steps."""
    walls = []
    extra = ["--max-steps", "5"] if work.quick else []
    for _ in range(reps):
        run = work.fresh("default")
        _, elapsed, _ = run_lmctl(["train", "clm", "-o", run, "--no-progress", *extra], work.env())
        walls.append(elapsed)
    name = "lmctl train clm (the embedded default)" + (", 5 steps" if work.quick else "")
    return [Figure("end to end", name, "s", walls)]
