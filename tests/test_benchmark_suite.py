"""The benchmark suite's own arithmetic: alternating runs and ratios of medians."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from types import SimpleNamespace

from benchmarks.figures import Figure, interleave, render

from tests.conftest import minilm_path


def test_sides_alternate_and_ratios_are_of_medians() -> None:
    calls: list[str] = []
    runs = interleave(3, {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert len(runs["a"]) == 3
    speed = Figure("s", "throughput", "x/s", [10.0, 30.0, 20.0], [5.0, 100.0, 10.0], "higher", 1.5)
    assert speed.ratio() == 2.0  # 20 / 10: one outlier moves no median
    time = Figure("s", "time", "s", [1.0, 2.0, 3.0], [10.0, 20.0, 30.0], "lower", 10.0)
    assert time.ratio() == 10.0
    args = argparse.Namespace(quick=True, reps=3, shared=True)
    text = render([speed, time], {"cores": 2}, args, 1.0)
    assert (
        "| s | throughput | x/s | 10.0 / 20.0 / 30.0 | 5 / 10.0 / 100.0 | 2.00x | >= 1.5x | yes |"
        in text
    )
    assert "shared" in text


def test_a_lower_figure_at_or_below_zero_meets_its_target_without_a_ratio() -> None:
    """Memory growth within the noise of the loaded model's peak can come out negative: the
    target (at most half the baseline's) is met, and no ratio is printed for it."""
    growth = Figure("e", "growth", "MiB", [-20.0, -19.0, 15.0], [245.0, 253.0, 255.0], "lower", 2.0)
    assert growth.ratio() is None and growth.met() is True
    args = argparse.Namespace(quick=True, reps=3, shared=False)
    assert (
        "| e | growth | MiB | -20.0 / -19.0 / 15.0 | 245.0 / 253.0 / 255.0 |  | >= 2x | yes |"
        in (render([growth], {"cores": 2}, args, 1.0))
    )
    worse = Figure("e", "growth", "MiB", [150.0, 160.0, 170.0], [245.0, 253.0, 255.0], "lower", 2.0)
    assert worse.met() is False and worse.ratio() == 253.0 / 160.0
    slower = Figure("t", "speed", "x/s", [10.0, 14.0, 15.0], [10.0, 11.0, 12.0], "higher", 1.3)
    assert slower.met() is False  # 14 / 11 = 1.27


def test_a_curve_that_ends_above_the_target_is_extrapolated_over_its_evaluations() -> None:
    """A line-by-line curve has five evaluations and the final model's second one at the same
    step; the extrapolation runs along the last third of the evaluations, not along the two
    equal final points (which would never reach the target)."""
    import math

    from benchmarks.grid import time_to

    curve = [[12, 2.0, 6.53], [24, 4.0, 6.44], [36, 6.0, 6.41], [48, 8.0, 6.38],
             [60, 10.0, 6.37], [60, 10.1, 6.37]]  # fmt: skip
    seconds, extrapolated = time_to(curve, 6.33)
    assert extrapolated and math.isclose(seconds, 10.0 + 2.0 * (6.37 - 6.33) / (6.38 - 6.37))
    seconds, extrapolated = time_to(curve, 6.40)
    assert not extrapolated and math.isclose(seconds, 6.0 + 2.0 * (6.41 - 6.40) / (6.41 - 6.38))
    assert time_to([[1, 1.0, 5.0], [2, 2.0, 5.1], [2, 2.1, 5.1]], 4.0) == (math.inf, True)


def test_a_grid_cell_gives_both_sides_the_same_inputs(tmp_path: Path) -> None:
    """The upstream recipe passes every column the tokenizer returns; a causal LM's cell with
    BERT's vocabulary saves a tokenizer without segment ids (GPT-2 would embed them), so both
    sides feed the model token ids alone; a masked LM's cell keeps them."""
    from benchmarks.grid import Cell, GridWork
    from transformers import AutoTokenizer

    grid = GridWork(SimpleNamespace(root=tmp_path, tokenizer=minilm_path()))
    causal = AutoTokenizer.from_pretrained(grid.model(Cell("clm", vocab=30522, hidden=64)))
    assert sorted(causal("to be or not to be")) == ["attention_mask", "input_ids"]
    masked = AutoTokenizer.from_pretrained(grid.model(Cell("mlm", hidden=64, lines="short")))
    assert "token_type_ids" in masked("to be or not to be")


def test_the_grid_repeats_cells_at_another_seed_on_both_sides(tmp_path: Path) -> None:
    """A repeat at the same seed would show the clock's noise only; the repeated cells draw
    other masks, dropout and batch order, on both sides alike."""
    from benchmarks.grid import (
        REPEAT_SEED,
        REPEATED,
        Cell,
        Outcome,
        arguments,
        cells,
        schedule,
    )
    from benchmarks.grid_page import seeds
    from benchmarks.upstream import _args

    runs = schedule()
    assert runs[: len(cells())] == cells()
    repeats = runs[len(cells()) :]
    assert [dataclasses.replace(cell, seed=Cell.seed) for cell in repeats] == [
        cells()[i] for i in REPEATED
    ]
    assert len({cell.name for cell in runs}) == len(runs)  # every row of the page says which
    for cell in (runs[0], repeats[0], repeats[1]):
        upstream, lmctl = arguments(cell, tmp_path, tmp_path / "t", tmp_path / "v")
        assert _args([*upstream, "--output-dir", "o", "--out", "r"]).seed == cell.seed
        assert lmctl[lmctl.index("--seed") + 1] == str(cell.seed)
    assert {cell.seed for cell in repeats} == {REPEAT_SEED} != {Cell.seed}
    # --grid-seed: the grid at one other seed, each cell once (a sweep over seeds).
    assert schedule(seed=3) == [dataclasses.replace(cell, seed=3) for cell in cells()]
    # The page says which seeds its runs were drawn at.
    assert seeds([Outcome(cell, {}, {}) for cell in schedule(seed=3)]) == (
        "Both sides run at seed 3."
    )
    assert "another seed run again" in seeds([Outcome(cell, {}, {}) for cell in runs])
