"""Two processes on the CPU, both engines, both launchers: one run, one set of results, ranks
on disjoint data; results equal to one process with accumulation; `--nproc` equals the
launcher command it prints; every rank agrees to stop."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from pathlib import Path

import pytest

from lmctl.run import checkpoints as run_checkpoints
from tests.distributed.conftest import (
    RECORDER,
    TINY_BERT,
    TINY_GPT2,
    descendants,
    finish,
    kill_when,
    lmctl_command,
    max_difference,
    rank_of,
    records,
    results,
    run,
    start,
    weights,
)

pytestmark = pytest.mark.distributed


def training_args(
    objective: str, tokenizer: Path, data: tuple[Path, Path], out: Path, *extra: str
) -> list[str]:
    train, valid = data
    model = TINY_GPT2 if objective == "clm" else TINY_BERT
    shape = (
        ("--block-size", "32")
        if objective == "clm"
        else ("--line-by-line", "--max-seq-length", "32")
    )
    return [
        "train", objective, *model, "--tokenizer", str(tokenizer), "--train-file", str(train),
        "--validation-file", str(valid), *shape, "--max-steps", "10",
        "--per-device-train-batch-size", "4", "--learning-rate", "1e-3", "--save-steps", "5",
        "--import", str(RECORDER), "-o", str(out), *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("objective", ["clm", "mlm"])
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_two_processes_train_one_model_on_disjoint_data(
    engine: str,
    launcher: str,
    objective: str,
    *,
    bpe_tokenizer: Path,
    wordpiece_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    tokenizer = bpe_tokenizer if objective == "clm" else wordpiece_tokenizer
    out, seen = tmp_path / "run", tmp_path / "seen"
    seen.mkdir()
    args = training_args(objective, tokenizer, unique_lines, out, "--engine", engine)
    proc = run(
        lmctl_command(*args, "--nproc", "2", "--launcher", launcher),
        tmp_path,
        {"LMCTL_RECORD_DIR": str(seen)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count(f"lmctl train {objective}:") == 1  # only the main process prints
    assert proc.stderr.count("run directory:") == 1
    # DistributedDataParallel expects the gradient layout an embedding's sparse flag announces
    assert "embedding gradient" not in proc.stderr
    assert (out / "model.safetensors").is_file()
    assert list(out.rglob("all_results.json")) == [out / "all_results.json"]
    assert results(out)["eval_loss"] > 0
    if objective == "mlm":
        # The loss of the saved model as one process measures it: the Trainer multiplies a
        # model's own batch mean by the number of processes unless told the model has one.
        check = run(lmctl_command("eval", out, "--json", "--output", tmp_path / "e.json"), tmp_path)
        assert check.returncode == 0, check.stderr[-4000:]
        measured = json.loads((tmp_path / "e.json").read_text())["eval_loss"]
        assert results(out)["eval_loss"] == pytest.approx(measured, rel=0.03)
        assert results(out)["train_loss"] < 2 * measured
    ranks = [records(seen, 0), records(seen, 1)]
    assert all(len(rows) == 10 * 4 for rows in ranks), [len(rows) for rows in ranks]
    assert not set(ranks[0]) & set(ranks[1]), "two ranks trained on the same example"
    # Torn down by lmctl, not left to interpreter shutdown (where gloo can abort a process).
    for rank in (0, 1):
        assert json.loads((seen / f"exit-{rank}.json").read_text()) == {"process_group": False}
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {
        p.name for p in (out / "checkpoint-10").iterdir()
    } or {"random_states_0.pkl", "random_states_1.pkl"} <= {
        p.name for p in (out / "checkpoint-10").iterdir()
    }


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_a_tokenizer_trained_for_the_run_is_the_same_on_every_rank(
    launcher: str, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two WordPiece trainings on one text differ; the main process trains the run's
    tokenizer and every rank tokenizes with it: each rank's training rows are lines of the
    training file as the saved tokenizer encodes them."""
    from transformers import AutoTokenizer

    train, valid = unique_lines
    out, seen = tmp_path / "run", tmp_path / "seen"
    seen.mkdir()
    proc = run(
        lmctl_command(
            "train", "mlm", *TINY_BERT, "--train-tokenizer", "300", "--train-file", train,
            "--validation-file", valid, "--line-by-line", "--max-seq-length", "32",
            "--max-steps", "4", "--per-device-train-batch-size", "4", "--save-strategy", "no",
            "--import", RECORDER, "-o", out, "--nproc", "2", "--launcher", launcher,
        ),
        tmp_path,
        # A cache of its own: a tokenizer kept by another test would not be trained here.
        {"LMCTL_RECORD_DIR": str(seen), "LMCTL_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("trained a wordpiece tokenizer") == 1, proc.stderr[-4000:]
    tokenizer = AutoTokenizer.from_pretrained(out)
    lines = [line for line in train.read_text().splitlines() if line.strip()]
    encoded = tokenizer(lines, truncation=True, max_length=32)["input_ids"]
    known = {tuple(ids) for ids in encoded}
    for rank in (0, 1):
        rows = records(seen, rank)
        assert len(rows) == 4 * 4, (rank, len(rows))
        strange = [row for row in rows if row not in known]
        assert not strange, f"rank {rank} trained on rows the saved tokenizer does not make"


def test_nproc_runs_the_launcher_command_it_prints(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    first = tmp_path / "first"
    proc = run(
        lmctl_command(*training_args("clm", bpe_tokenizer, unique_lines, first), "--nproc", "2"),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    shown = next(line for line in proc.stderr.splitlines() if "running: " in line)
    command = shlex.split(shown.split("running: ", 1)[1])
    assert command[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node"]
    assert "--nproc" not in command  # the launched processes run the plain command
    second = tmp_path / "second"
    command[command.index(str(first))] = str(second)
    again = run(command, tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert max_difference(weights(first), weights(second)) == 0.0
    timing = ("runtime", "per_second")
    same = [r for r in (results(first), results(second))]
    assert {k: v for k, v in same[0].items() if not any(t in k for t in timing)} == {
        k: v for k, v in same[1].items() if not any(t in k for t in timing)
    }


def test_two_processes_equal_one_with_accumulation(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    """2 processes x batch 4 and 1 process x batch 4 x accumulation 2 see the same number of
    examples per step; their final eval losses agree within 3%."""
    two, one = tmp_path / "two", tmp_path / "one"
    args = training_args("clm", bpe_tokenizer, unique_lines, two)
    proc = run(lmctl_command(*args, "--nproc", "2"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    args = training_args(
        "clm", bpe_tokenizer, unique_lines, one, "--gradient-accumulation-steps", "2"
    )
    proc = run(lmctl_command(*args), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    loss_two, loss_one = results(two)["eval_loss"], results(one)["eval_loss"]
    assert loss_two == pytest.approx(loss_one, rel=0.03)
    assert results(two)["train_samples"] == results(one)["train_samples"]


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_a_signal_to_one_rank_stops_both_at_the_same_step(
    engine: str, bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    out, seen = tmp_path / "run", tmp_path / "seen"
    seen.mkdir()
    args = training_args(
        "clm", bpe_tokenizer, unique_lines, out, "--engine", engine, "--save-steps", "100"
    )
    args[args.index("--max-steps") + 1] = "200"
    proc = start(lmctl_command(*args, "--nproc", "2"), tmp_path,
                 {"LMCTL_RECORD_DIR": str(seen), "LMCTL_STEP_DELAY": "0.1"})  # fmt: skip
    deadline = time.monotonic() + 300
    while len(records(seen, 1)) < 12 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    pids = [p for p in descendants(proc.pid) if rank_of(p) == "1"]
    assert pids, "no rank-1 process found"
    os.kill(pids[0], signal.SIGTERM)  # one rank only: the launcher and rank 0 are not told
    done = finish(proc)
    assert done.returncode == 130, done.stderr[-4000:]
    checkpoints = run_checkpoints.checkpoints(out)
    assert len(checkpoints) == 1, checkpoints
    step = run_checkpoints.checkpoint_step(checkpoints[0])
    assert 0 < step < 200
    assert len(records(seen, 0)) == len(records(seen, 1)) == step * 4  # same step on both


def test_a_non_finite_loss_on_one_rank_stops_both(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = training_args("clm", bpe_tokenizer, unique_lines, out)
    proc = run(lmctl_command(*args, "--nproc", "2"), tmp_path, {"LMCTL_NAN_RANK": "1"})
    assert proc.returncode == 4, proc.stderr[-4000:]
    assert "loss is nan" in proc.stderr.lower()


def test_resume_runs_on_the_processes_the_run_was_saved_by(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    """`lmctl resume RUN` of a run of 2 processes runs on 2 (under the launcher, as --nproc 2
    would)."""
    out = tmp_path / "run"
    train, _ = unique_lines
    args = [
        "train", "clm", *TINY_GPT2, "--tokenizer", str(bpe_tokenizer), "--train-file",
        str(train), "--block-size", "32", "--max-steps", "2", "--no-eval", "-o", str(out),
        "--nproc", "2",
    ]  # fmt: skip
    proc = run(lmctl_command(*args), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = run(lmctl_command("resume", out, "--max-steps", "4"), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming on --nproc 2" in resumed.stderr
    shown = next(line for line in resumed.stderr.splitlines() if "running: " in line)
    assert "--nproc_per_node 2" in shown
    latest = run_checkpoints.latest_checkpoint(out)
    assert latest is not None and latest.name == "checkpoint-4"
    assert run_checkpoints.checkpoint_world_size(latest) == 2


def _steps(seen: Path, ranks: int, per_forward: int, forwards_per_step: int) -> list[set]:
    """The examples of each optimizer step, from the rows each rank recorded in order."""
    rows = [records(seen, rank) for rank in range(ranks)]
    size = per_forward * forwards_per_step
    steps = max(len(r) for r in rows) // size
    return [
        {row for r in rows for row in r[step * size : (step + 1) * size]} for step in range(steps)
    ]


@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_resume_on_another_number_of_processes_continues_the_same_global_batches(
    engine: str,
    saved_on: int,
    resumed_on: int,
    *,
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """SIGKILL after a checkpoint, `lmctl resume --nproc M` on another number: the
    accumulation changes so the global batch stays 8, every optimizer step trains on the
    examples the uninterrupted run trained on at that step, and the final eval loss is the
    uninterrupted run's within 1%."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    seen_full, seen_killed, seen_resumed = (tmp_path / n for n in ("sf", "sk", "sr"))
    for folder in (seen_full, seen_killed, seen_resumed):
        folder.mkdir()
    accumulation = {2: "1", 1: "2"}[saved_on]

    def args(out: Path) -> list[str]:
        return [*training_args("clm", bpe_tokenizer, unique_lines, out, "--engine", engine),
                "--save-steps", "4", "--nproc", str(saved_on),
                "--gradient-accumulation-steps", accumulation]  # fmt: skip

    proc = run(lmctl_command(*args(full)), tmp_path, {"LMCTL_RECORD_DIR": str(seen_full)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "0.5"}
    kill_when(start(lmctl_command(*args(killed)), tmp_path, slow), (killed / "checkpoint-4").is_dir)
    assert not (killed / "model.safetensors").exists()
    resumed = run(
        lmctl_command("resume", killed, "--nproc", str(resumed_on)),
        tmp_path,
        {"LMCTL_RECORD_DIR": str(seen_resumed)},
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"continuing on {resumed_on} with the same global batch of 8" in resumed.stderr
    expected = _steps(seen_full, saved_on, 4, 2 // saved_on)
    assert len(expected) == 10
    done = _steps(seen_resumed, resumed_on, 4, 2 // resumed_on)
    assert len(done) == 10 - 4
    assert done == expected[4:]
    latest = run_checkpoints.latest_checkpoint(killed)
    assert latest is not None and latest.name == "checkpoint-10"
    assert run_checkpoints.checkpoint_world_size(latest) == resumed_on
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["LmctlGlobalBatch"] == {
        "per_device": 4, "processes": resumed_on, "accumulation": 2 // resumed_on,
    }  # fmt: skip
    assert results(killed)["train_loss"] > 0
    final, uninterrupted = results(killed)["eval_loss"], results(full)["eval_loss"]
    assert abs(final - uninterrupted) <= 0.01 * uninterrupted, (final, uninterrupted)
