"""What lmctl shows: on a terminal of 100 columns (a rich console drawing into a buffer) and
in plain lines; and how the process that ran ``--nproc`` reads its processes' reports."""

from __future__ import annotations

import io
import re

import pytest

from lmctl.console import Console, OutputOptions, terminal_console
from lmctl.errors import ExitCode

#: A start line as long as those that a terminal used to break inside words.
LONG_LINE = (
    "fast paths (cuda, bf16): on: allocator, fused-gelu, tiled-loss, sparse-embedding, "
    "fused-adamw, skip-padding; off: liger (the liger-kernel package is not installed: "
    "pip install it to use it)"
)


def on_terminal(width: int = 100) -> tuple[Console, io.StringIO]:
    """A console as on a terminal of ``width`` columns, drawing into a buffer."""
    buffer = io.StringIO()
    console = Console(OutputOptions())
    console.plain = False
    console._rich = terminal_console(file=buffer, width=width, force_terminal=True)
    return console, buffer


def screen_lines(buffer: io.StringIO) -> list[str]:
    """What a terminal shows, line by line: without escape codes, each redraw a line."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())
    return [line for line in re.split(r"[\r\n]", text) if line.strip()]


def test_long_messages_wrap_at_word_boundaries() -> None:
    console, buffer = on_terminal()
    console.info(LONG_LINE)
    console.warn(LONG_LINE)
    lines = screen_lines(buffer)
    assert len(lines) == 4, lines  # each message on two lines
    assert all(len(line) <= 100 for line in lines), lines
    words = LONG_LINE.split()
    # Every word whole, on one line: none cut in two by the end of a line.
    assert " ".join(lines).split() == [*words, "warn:", *words]


def test_the_progress_line_leaves_room_for_an_echoed_ctrl_c() -> None:
    """The terminal echoes Ctrl-C as ``^C`` after the progress line; a full-width line
    wrapped, and the display drew its next frame below a copy of the last one."""
    console, buffer = on_terminal()
    console.start_progress(400)
    stats = {"epoch": 2.55, "tok/s": 4635, "loss": 5.4503, "lr": 1.013e-05, "grad": 0.8207}
    console.update_progress(327, {**stats, "note": "x" * 60}, log_line=False)
    console.stop_progress()
    lines = screen_lines(buffer)
    assert lines and max(len(line) for line in lines) <= 98, lines


def test_an_evaluation_of_a_stream_says_the_samples_it_saw(
    capsys: pytest.CaptureFixture[str],
) -> None:
    console = Console(OutputOptions(no_progress=True))
    console.start_progress(None, "evaluating")
    console.update_progress(5, {}, log_line=False)
    console.stop_progress(20)
    console.start_progress(7, "evaluating")
    console.stop_progress(28)
    lines = [line.split(" INFO  ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert lines == ["evaluating", "evaluating: 20 samples", "evaluating: 7 steps"]


def test_a_stream_evaluation_on_a_terminal_shows_no_total() -> None:
    console, buffer = on_terminal()
    console.start_progress(None, "evaluating")
    console.update_progress(3, {}, log_line=False)
    console.stop_progress(12)
    shown = "\n".join(screen_lines(buffer))
    assert "step 3" in shown and "step 3/" not in shown and "None" not in shown
    assert "evaluating: 12 samples" in shown


def test_a_reporter_shows_the_passes_over_a_stream(tmp_path: object) -> None:
    from pathlib import Path

    from lmctl.run.progress import StepReporter
    from lmctl.run.signals import StopRequest

    shown = []
    for streaming in (False, True):
        reporter = StepReporter(
            Console(OutputOptions(quiet=True)),
            Path(str(tmp_path)),
            StopRequest(),
            is_main=True,
            streaming=streaming,
        )
        reporter.step(3, 1.0)
        shown.append(reporter.stats["epoch"])
    assert shown == [1.0, 1]
    assert isinstance(shown[1], int)


def report(rank: int, code: int, error: str | None = None, attempt: int = 0) -> dict[str, object]:
    record: dict[str, object] = {"rank": rank, "attempt": attempt, "exit_code": code}
    if error is not None:
        record.update({"error": error, "hint": "fix it", "said": rank == 0})
    return record


def test_every_process_with_the_same_error_is_said_once() -> None:
    from lmctl.run.launch import errors_to_say, outcome

    reports = [report(1, 3, "blank.txt: no records"), report(0, 3, "blank.txt: no records")]
    assert errors_to_say(reports) == []  # the main process said it
    assert outcome(reports, launcher_code=1) == 3
    both_others = [report(0, 0), report(1, 3, "shard 2: bad"), report(2, 3, "shard 2: bad")]
    assert errors_to_say(both_others) == [("shard 2: bad", "fix it")]


def test_the_first_failure_counts_not_the_processes_stopped_after_it() -> None:
    """A process that fails alone makes the launcher stop the others, which then stop as
    interrupted: the exit code and the message are the failure's."""
    from lmctl.run.launch import errors_to_say, outcome

    interrupted = report(0, int(ExitCode.INTERRUPTED), "interrupted outside the training loop")
    interrupted["said"] = False
    reports = [report(1, 2, "checkpoint-2 was saved by 1 process(es)"), interrupted]
    assert outcome(reports, launcher_code=1) == 2
    assert errors_to_say(reports) == [("checkpoint-2 was saved by 1 process(es)", "fix it")]
    # Interrupted everywhere (Ctrl-C): the main process's word, left to the launching one.
    assert outcome([interrupted], launcher_code=1) == 130
    assert errors_to_say([interrupted]) == [("interrupted outside the training loop", "fix it")]
    # A restarted attempt that succeeded: the run succeeded, and the main process stopped
    # for the restart is no error.
    failed_then_ok = [interrupted, report(0, 0, attempt=1), report(1, 0, attempt=1)]
    assert outcome(failed_then_ok, launcher_code=0) == 0
    assert errors_to_say(failed_then_ok) == []
    assert outcome([], launcher_code=137) == 137  # nothing reported: a crash


def test_nproc_1_needs_no_launcher_and_several_get_one_thread_each(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmctl.config.slices import LaunchSpec
    from lmctl.run.launch import runs_in_process, thread_environment

    def spec(**values: object) -> LaunchSpec:
        base: dict[str, object] = {
            "nproc": 1, "nnodes": 1, "min_nnodes": None, "node_rank": 0, "master_addr": None,
            "master_port": None, "launcher": "torchrun", "max_restarts": 0,
        }  # fmt: skip
        return LaunchSpec(**{**base, **values})  # type: ignore[arg-type]

    assert runs_in_process(spec())
    assert not runs_in_process(spec(nproc=2))
    assert not runs_in_process(spec(max_restarts=1))  # restarts need the elastic agent
    assert not runs_in_process(spec(nnodes=2, master_addr="10.0.0.1"))
    assert not runs_in_process(spec(launcher="accelerate"))  # it applies accelerate config
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_environment(spec(nproc=2)) == {"OMP_NUM_THREADS": "1"}
    assert thread_environment(spec()) == {}
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert thread_environment(spec(nproc=2)) == {}
