"""The benchmark suite's own arithmetic: alternating runs and ratios of medians."""

from __future__ import annotations

import argparse

from benchmarks.run import Figure, interleave, render


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
