"""Bad input to every command: the documented exit code, one message, no traceback, and every
file the user had byte-identical afterwards.

Each case builds its inputs in a fresh workspace, runs one command (in-process unless it
needs a process of its own) and checksums the workspace and the shared fixtures before and
after. A failing command must not leave anything behind in the workspace either.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import S3Store, swag_records
from tests.reliability.conftest import TINY
from tests.reliability.harness import (
    Outcome,
    changed_files,
    checksums,
    forked,
    invoke,
    record,
)


@dataclass
class Ctx:
    """What a case may use: its workspace and the shared fixtures."""

    ws: Path
    tok: Path
    wordpiece: Path
    corpus: Path
    models: dict[str, Path]
    swag: tuple[Path, Path]
    reference: Path
    s3: S3Store | None = None
    env: dict[str, str] | None = None

    def file(self, name: str, content: bytes | str) -> str:
        path = self.ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        return str(path)

    def clm(self, *extra: str) -> list[str]:
        """A tiny from-scratch clm run that would train for two steps."""
        return [
            "train",
            "clm",
            "--model-type",
            "gpt2",
            "--config-overrides",
            TINY,
            "--tokenizer-name",
            str(self.tok),
            "--block-size",
            "32",
            "--max-steps",
            "2",
            "--no-eval",
            "-o",
            str(self.ws / "out"),
            *extra,
        ]

    def with_corpus(self, *extra: str) -> list[str]:
        return self.clm("--train-file", str(self.corpus), *extra)

    def objective(self, name: str, *extra: str) -> list[str]:
        """A pretrained-model run of mlm, plm or swag (data given by ``extra``)."""
        return ["train", name, "--max-steps", "2", "--no-eval", "-o", str(self.ws / "out"), *extra]

    def run(self) -> str:
        """A private copy of a finished run (checkpoints and final model)."""
        copy = self.ws / "run"
        if not copy.exists():
            shutil.copytree(self.reference, copy)
        return str(copy)


@dataclass
class Case:
    id: str
    build: Callable[[Ctx], list[str]]
    code: int
    needle: str = ""
    #: run in a process of its own (credentials read from the environment by the store client)
    process: bool = False
    #: exit codes that are also correct (e.g. a run that refuses, or trains keeping every file)
    alternatives: tuple[int, ...] = ()


def _jsonl(records: list[dict[str, object]]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _damaged_model(c: Ctx, name: str, damage: Callable[[Path], None]) -> str:
    """A copy of the tiny GPT-2 whose weights file ``damage`` spoils."""
    model = c.ws / name
    shutil.copytree(c.models["gpt2"], model)
    damage(model / "model.safetensors")
    return str(model)


def _model_without_weights(c: Ctx) -> str:
    return _damaged_model(c, "gpt2-no-weights", Path.unlink)


def _model_without_tokenizer(c: Ctx) -> str:
    """A copy of the tiny BERT with its config and weights only."""
    model = c.ws / "notok"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(c.models["bert"] / name, model / name)
    return str(model)


def _model_truncated(c: Ctx) -> str:
    return _damaged_model(c, "gpt2-truncated", _truncate)


def _run_truncated_final(c: Ctx) -> str:
    run = Path(c.run())
    _truncate(run / "model.safetensors")
    return str(run)


def _run_broken_checkpoints(c: Ctx) -> str:
    run = Path(c.run())
    for checkpoint in run.glob("checkpoint-*"):
        _truncate(checkpoint / "model.safetensors")
    (run / "trainer_state.json").unlink()
    return str(run)


def _non_run_dir(c: Ctx) -> str:
    """A project folder with a hand-written lmctl.yaml: not a run lmctl made."""
    project = c.ws / "project"
    c.file("project/lmctl.yaml", "learning_rate: 0.001\n")
    c.file("project/src/main.py", "print('mine')\n")
    c.file("project/.git/HEAD", "ref: refs/heads/main\n")
    c.file("project/notes.txt", "do not delete\n")
    return str(project)


def _encoder_args(c: Ctx, objective: str, train: str, *extra: str) -> list[str]:
    """``train mlm`` or ``train swag`` of the tiny BERT with its WordPiece tokenizer."""
    return c.objective(
        objective,
        "--model",
        str(c.models["bert"]),
        "--tokenizer-name",
        str(c.wordpiece),
        "--train-file",
        train,
        "--max-seq-length",
        "32",
        *extra,
    )


CASES = [
    # Files --------------------------------------------------------------------------------
    Case(
        "clm-missing-file",
        lambda c: c.clm("--train-file", str(c.ws / "nope.txt")),
        2,
        "no such file",
    ),
    Case(
        "clm-empty-file", lambda c: c.clm("--train-file", c.file("empty.txt", "")), 3, "empty.txt"
    ),
    Case(
        "clm-directory-as-file",
        lambda c: c.clm("--train-file", str((c.ws / "dir.txt").mkdir() or c.ws / "dir.txt")),
        2,
        "dir.txt",
    ),
    Case(
        "clm-binary-file",
        lambda c: c.clm("--train-file", c.file("blob.txt", bytes(range(256)) * 64)),
        3,
        "blob.txt",
    ),
    Case(
        "mlm-non-utf8-file",
        lambda c: _encoder_args(
            c, "mlm", c.file("latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
        ),
        3,
        "latin1.txt",
    ),
    Case(
        "clm-truncated-json-lines",
        lambda c: c.clm(
            "--train-file", c.file("cut.jsonl", '{"text": "one line"}\n{"text": "two li')
        ),
        3,
        "cut.jsonl",
    ),
    Case(
        "clm-wrong-text-column",
        lambda c: c.clm(
            "--train-file",
            c.file("rows.jsonl", _jsonl([{"body": "words here"}] * 20)),
            "--text-column",
            "text",
        ),
        3,
        "text",
    ),
    Case(
        "clm-empty-text-column",
        lambda c: c.clm("--train-file", c.file("blank.jsonl", _jsonl([{"text": ""}] * 20))),
        3,
        "blank.jsonl",
    ),
    Case(
        "clm-csv-without-rows",
        lambda c: c.clm("--train-file", c.file("header.csv", "text\n")),
        3,
        "header.csv",
    ),
    Case(
        "swag-missing-label-column",
        lambda c: _encoder_args(
            c,
            "swag",
            c.file(
                "nolabel.jsonl",
                _jsonl(
                    [{k: v for k, v in r.items() if k != "label"} for r in swag_records(8, seed=3)]
                ),
            ),
        ),
        3,
        "label",
    ),
    Case(
        "swag-label-out-of-range",
        lambda c: _encoder_args(
            c,
            "swag",
            c.file("badlabel.jsonl", _jsonl([{**r, "label": 9} for r in swag_records(8, seed=3)])),
        ),
        3,
        "badlabel.jsonl",
    ),
    Case(
        "config-one-enormous-line",
        lambda c: c.with_corpus(
            "--config", c.file("huge.yaml", "warmup_steps: " + "9x" * 500_000 + "\n")
        ),
        2,
        "warmup_steps",
    ),
    Case(
        "prepare-mlm-binary-file",
        lambda c: [
            "prepare",
            "mlm",
            "--tokenizer-name",
            str(c.wordpiece),
            "--train-file",
            c.file("noise.txt", os.urandom(4096)),
        ],
        3,
        "noise.txt",
    ),
    # Configs ------------------------------------------------------------------------------
    Case(
        "config-broken-yaml",
        lambda c: c.with_corpus("--config", c.file("a.yaml", "seed: [1, 2\n")),
        2,
        "invalid YAML",
    ),
    Case(
        "config-broken-toml",
        lambda c: c.with_corpus("--config", c.file("a.toml", "seed = = 3\n")),
        2,
        "invalid TOML",
    ),
    Case(
        "config-broken-json",
        lambda c: c.with_corpus("--config", c.file("a.json", '{"seed": 3,')),
        2,
        "invalid JSON",
    ),
    Case(
        "config-not-a-mapping",
        lambda c: c.with_corpus("--config", c.file("l.yaml", "- 1\n- 2\n")),
        2,
        "mapping",
    ),
    Case(
        "config-wrong-type",
        lambda c: c.with_corpus("--config", c.file("t.yaml", "warmup_steps: many\n")),
        2,
        "warmup_steps",
    ),
    Case(
        "config-training-args-not-mapping",
        lambda c: c.with_corpus("--config", c.file("ta.yaml", "training_args: 5\n")),
        2,
        "training_args",
    ),
    Case(
        "config-unknown-key",
        lambda c: c.with_corpus("--config", c.file("u.yaml", "frobnicate: 1\n")),
        2,
        "frobnicate",
    ),
    Case(
        "config-misspelled-key",
        lambda c: c.with_corpus("--config", c.file("m.json", '{"learning_rat": 0.1}')),
        2,
        "did you mean 'learning_rate'",
    ),
    Case(
        "config-other-objective",
        lambda c: c.with_corpus("--config", c.file("o.yaml", "objective: mlm\n")),
        2,
        "not 'clm'",
    ),
    Case(
        "config-unsupported-suffix",
        lambda c: c.with_corpus("--config", c.file("a.ini", "[x]\n")),
        2,
        "a.ini",
    ),
    Case(
        "config-is-a-directory",
        lambda c: c.with_corpus("--config", str((c.ws / "c.yaml").mkdir() or c.ws / "c.yaml")),
        2,
        "c.yaml",
    ),
    Case(
        "config-missing-file",
        lambda c: c.with_corpus("--config", str(c.ws / "gone.yaml")),
        2,
        "no such file",
    ),
    Case(
        "flag-wrong-type", lambda c: c.with_corpus("--learning-rate", "fast"), 2, "--learning-rate"
    ),
    Case("flag-unknown", lambda c: c.with_corpus("--learning-rat", "0.1"), 2, "--learning-rat"),
    # Mistakes the command-line parser finds before any command code runs
    Case("flag-missing-value", lambda c: c.with_corpus("--max-steps"), 2, "--max-steps"),
    Case("flag-unknown-runs", lambda c: ["runs", str(c.ws), "--bogus-flag"], 2, "--bogus-flag"),
    Case("command-unknown", lambda c: ["train", "bert"], 2, "clm, mlm, plm, swag"),
    Case("command-unknown-root", lambda c: ["trian", "clm"], 2, "'lmctl train'"),
    Case("argument-missing", lambda c: ["resume"], 2, "RUN_DIR"),
    Case("argument-extra", lambda c: ["eval", c.run(), "surplus"], 2, "surplus"),
    Case(
        "config-key-under-two-names",
        lambda c: c.with_corpus(
            "--config", c.file("two.yaml", "model: ./a\nmodel_name_or_path: ./b\n")
        ),
        2,
        "both set --model-name-or-path",
    ),
    Case(
        "clm-data-directory",
        lambda c: c.clm("--train-file", str((c.ws / "data").mkdir() or c.ws / "data")),
        2,
        "is a directory",
    ),
    Case(
        "mlm-missing-local-model",
        lambda c: c.objective(
            "mlm", "--model", str(c.ws / "minilm"), "--train-file", str(c.corpus)
        ),
        2,
        "no such directory",
    ),
    Case(
        "mlm-model-without-tokenizer",
        lambda c: c.objective(
            "mlm", "--model", _model_without_tokenizer(c), "--train-file", str(c.corpus)
        ),
        5,
        "has no tokenizer files: give --tokenizer-name",
    ),
    Case(
        "swag-default-columns-other-layout",
        lambda c: _encoder_args(
            c,
            "swag",
            c.file(
                "layout.jsonl",
                _jsonl([{"question": "q", "a": "x", "b": "y", "answer": 0}] * 8),
            ),
        ),
        3,
        "no column 'sent1', 'ending0', 'ending1', 'ending2', 'ending3' or 'label'",
    ),
    Case(
        "contradictory-precision",
        lambda c: c.with_corpus("--bf16", "--fp16"),
        2,
        "--bf16 and --fp16",
    ),
    Case(
        "contradictory-pretrained-overrides",
        lambda c: [
            "train",
            "clm",
            "--model",
            str(c.models["gpt2"]),
            "--config-overrides",
            "n_layer=2",
            "--train-file",
            str(c.corpus),
            "-o",
            str(c.ws / "out"),
        ],
        2,
        "--config-overrides",
    ),
    Case(
        "unknown-tracker",
        lambda c: c.with_corpus("--report-to", "nosuchtracker"),
        2,
        "nosuchtracker",
    ),
    Case(
        "scheduler-missing-kwargs",
        lambda c: c.with_corpus("--lr-scheduler-type", "cosine_with_min_lr"),
        2,
        "lr_scheduler_kwargs",
    ),
    Case(
        "mlm-probability-out-of-range",
        lambda c: _encoder_args(c, "mlm", str(c.corpus), "--mlm-probability", "1.5"),
        2,
        "--mlm-probability",
    ),
    Case(
        "plm-odd-sequence-length",
        lambda c: c.objective(
            "plm",
            "--model-type",
            "xlnet",
            "--tokenizer-name",
            str(c.tok),
            "--train-file",
            str(c.corpus),
            "--max-seq-length",
            "33",
        ),
        2,
        "--max-seq-length",
    ),
    Case(
        "prepare-without-tokenizer",
        lambda c: ["prepare", "clm", "--train-file", str(c.corpus)],
        2,
        "tokenizer",
    ),
    Case(
        "prepare-streaming",
        lambda c: [
            "prepare",
            "clm",
            "--tokenizer-name",
            str(c.tok),
            "--train-file",
            str(c.corpus),
            "--config",
            c.file("s.yaml", "streaming: true\n"),
        ],
        2,
        "stream",
    ),
    # Models -------------------------------------------------------------------------------
    Case(
        "model-missing-directory",
        lambda c: [
            "train",
            "clm",
            "--model",
            str(c.ws / "no-model"),
            "--train-file",
            str(c.corpus),
            "--max-steps",
            "2",
            "-o",
            str(c.ws / "out"),
        ],
        5,
        "no-model",
        alternatives=(2,),
    ),
    Case(
        "model-missing-weights",
        lambda c: [
            "train",
            "clm",
            "--model",
            _model_without_weights(c),
            "--train-file",
            str(c.corpus),
            "--max-steps",
            "2",
            "-o",
            str(c.ws / "out"),
        ],
        5,
        "gpt2-no-weights",
    ),
    Case(
        "model-truncated-weights",
        lambda c: [
            "train",
            "clm",
            "--model",
            _model_truncated(c),
            "--train-file",
            str(c.corpus),
            "--max-steps",
            "2",
            "-o",
            str(c.ws / "out"),
        ],
        5,
        "gpt2-truncated",
    ),
    Case(
        "mlm-wrong-architecture",
        lambda c: c.objective(
            "mlm", "--model", str(c.models["gpt2"]), "--train-file", str(c.corpus)
        ),
        2,
        "gpt2",
    ),
    Case(
        "plm-wrong-architecture",
        lambda c: c.objective(
            "plm",
            "--model",
            str(c.models["bert"]),
            "--tokenizer-name",
            str(c.wordpiece),
            "--train-file",
            str(c.corpus),
        ),
        2,
        "bert",
    ),
    Case(
        "swag-wrong-architecture",
        lambda c: c.objective(
            "swag", "--model", str(c.models["gpt2"]), "--train-file", str(c.swag[0])
        ),
        2,
        "gpt2",
    ),
    Case(
        "mlm-tokenizer-without-mask-token",
        lambda c: c.objective(
            "mlm", "--model", str(c.models["bert"]), "--train-file", str(c.corpus)
        ),
        2,
        "mask",
    ),
    Case(
        "eval-truncated-weights",
        lambda c: [
            "eval",
            _model_truncated(c),
            "--task",
            "clm",
            "--validation-file",
            str(c.corpus),
        ],
        5,
        "gpt2-truncated",
    ),
    Case(
        "eval-truncated-final-model-of-run",
        lambda c: ["eval", _run_truncated_final(c)],
        5,
        "model.safetensors",
    ),
    # eval / resume ------------------------------------------------------------------------
    Case("eval-missing-path", lambda c: ["eval", str(c.ws / "nothing")], 2, "nothing"),
    Case(
        "eval-not-a-model",
        lambda c: ["eval", str((c.ws / "plain").mkdir() or c.ws / "plain")],
        2,
        "plain",
    ),
    Case(
        "eval-missing-validation-file",
        lambda c: ["eval", c.run(), "--validation-file", str(c.ws / "gone.txt")],
        2,
        "gone.txt",
    ),
    Case(
        "eval-output-under-a-file",
        lambda c: ["eval", c.run(), "-O", str(Path(c.file("taken", "mine\n")) / "m.json")],
        2,
        "taken",
    ),
    # predict ------------------------------------------------------------------------------
    Case(
        "predict-missing-path",
        lambda c: ["predict", str(c.ws / "nothing"), "--prompt", "x"],
        2,
        "nothing",
    ),
    Case("predict-no-input", lambda c: ["predict", c.run()], 2, "--prompt"),
    Case(
        "predict-missing-input-file",
        lambda c: ["predict", c.run(), "--input", str(c.ws / "gone.txt")],
        2,
        "gone.txt",
    ),
    Case(
        "predict-blank-input-file",
        lambda c: ["predict", c.run(), "--input", c.file("blank.txt", "\n \n")],
        3,
        "blank.txt",
    ),
    Case(
        "predict-truncated-final-model-of-run",
        lambda c: ["predict", _run_truncated_final(c), "--prompt", "x"],
        5,
        "model.safetensors",
    ),
    Case("resume-missing-dir", lambda c: ["resume", str(c.ws / "norun")], 2, "norun"),
    Case("resume-non-run-dir", lambda c: ["resume", _non_run_dir(c)], 2, "project"),
    Case(
        "resume-only-broken-checkpoints",
        lambda c: ["resume", _run_broken_checkpoints(c)],
        2,
        "no complete checkpoint",
    ),
    Case(
        "resume-config-refused",
        lambda c: ["resume", c.run(), "--config", c.file("r.yaml", "seed: 1\n")],
        2,
        "--config",
    ),
    Case(
        "resume-fixed-option",
        lambda c: ["resume", c.run(), "--learning-rate", "1"],
        2,
        "--learning-rate",
    ),
    # Destinations -------------------------------------------------------------------------
    Case("push-malformed-url", lambda c: ["push", c.run(), "--to", "s3:/bucket"], 2, "s3:/bucket"),
    Case("push-unknown-protocol", lambda c: ["push", c.run(), "--to", "zzz://bucket/x"], 2, "zzz"),
    Case("push-hub-missing-repo", lambda c: ["push", c.run(), "--to", "hf://"], 2, "hf://"),
    Case(
        "push-not-a-model-dir",
        lambda c: ["push", str(c.ws), "--to", f"file://{c.ws}/dest"],
        2,
        "not a run",
    ),
    Case(
        "push-token-file-missing",
        lambda c: ["push", c.run(), "--to", "hf://me/m", "--token-file", str(c.ws / "tok.txt")],
        2,
        "--token-file",
    ),
    Case(
        "push-missing-bucket",
        lambda c: ["push", c.run(), "--to", "s3://no-such-bucket/m"],
        2,
        "no-such-bucket",
        process=True,
    ),
    Case(
        "push-no-permission",
        lambda c: ["push", c.run(), "--to", "s3://models/denied"],
        7,
        "models",
        process=True,
    ),
    Case(
        "train-push-to-no-permission",
        lambda c: c.with_corpus("--push-to", "s3://models/denied-train"),
        7,
        "models",
        process=True,
    ),
    Case(
        "push-under-a-file",
        lambda c: ["push", c.run(), "--to", f"file://{c.file('dest', 'mine')}/model"],
        2,
        "dest",
        alternatives=(7,),
    ),
    # Output paths -------------------------------------------------------------------------
    Case(
        "output-is-a-file", lambda c: c.with_corpus("-o", c.file("out.txt", "mine\n")), 2, "out.txt"
    ),
    Case(
        "output-under-a-file",
        lambda c: c.with_corpus("-o", str(Path(c.file("parent", "mine\n")) / "run")),
        2,
        "parent",
    ),
    Case(
        "output-not-empty",
        lambda c: c.with_corpus("-o", str(Path(c.file("busy/keep.txt", "mine\n")).parent)),
        2,
        "not empty",
    ),
    Case(
        "overwrite-non-run-dir",
        lambda c: c.with_corpus("-o", _non_run_dir(c), "--overwrite-output-dir"),
        2,
        "project",
        alternatives=(0,),
    ),
]

#: Credentials a case runs with (moto's users), by case id.
READER_CASES = {"push-no-permission", "train-push-to-no-permission"}


def test_the_table_is_broad() -> None:
    commands = {"clm", "mlm", "plm", "swag", "prepare", "eval", "predict", "resume", "push"}
    covered = {word for case in CASES for word in case.id.split("-")} | {
        "clm" for case in CASES if case.id.startswith(("config", "flag", "output", "contradictory"))
    }
    assert len(CASES) >= 40
    assert commands <= covered | {"swag" for c in CASES if "swag" in c.id}


@pytest.fixture(scope="module")
def shared(  # noqa: PLR0917
    bpe_tokenizer: Path,
    wordpiece_tokenizer: Path,
    corpus: Path,
    tiny_models: dict[str, Path],
    swag_data: tuple[Path, Path],
    reference_run: Path,
    s3_store: S3Store,
) -> dict[str, object]:
    return {
        "tok": bpe_tokenizer,
        "wordpiece": wordpiece_tokenizer,
        "corpus": corpus,
        "models": tiny_models,
        "swag": swag_data,
        "reference": reference_run,
        "s3": s3_store,
    }


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(case: Case, shared: dict[str, object], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    s3 = shared["s3"]
    assert isinstance(s3, S3Store)
    ctx = Ctx(
        ws=ws,
        tok=shared["tok"],  # type: ignore[arg-type]
        wordpiece=shared["wordpiece"],  # type: ignore[arg-type]
        corpus=shared["corpus"],  # type: ignore[arg-type]
        models=shared["models"],  # type: ignore[arg-type]
        swag=shared["swag"],  # type: ignore[arg-type]
        reference=shared["reference"],  # type: ignore[arg-type]
        s3=s3,
    )
    argv = case.build(ctx)
    roots = [ws, ctx.tok, ctx.wordpiece, ctx.corpus, *ctx.models.values(), *ctx.swag, ctx.reference]
    before = checksums(roots)
    if case.process:
        env = s3.env(s3.reader if case.id in READER_CASES else None)
        outcome = forked(argv, tmp_path / "log", env=env)
    else:
        outcome = invoke(argv)
    after = checksums(roots)
    changed = changed_files(before, after)
    if outcome.code == 0:
        # a run that went ahead may add its own files, never touch the user's
        changed = [name for name in changed if name in before]
    record(
        outcome,
        expected=case.code if outcome.code not in case.alternatives else None,
        changed=len(changed),
    )
    check(case, outcome, changed)


#: Cases that fail before any training, run again with ``--json``.
JSON_CASES = [
    case
    for case in CASES
    if not case.process and case.id.startswith(("flag", "command", "argument", "config"))
]


@pytest.mark.parametrize("case", JSON_CASES, ids=[case.id for case in JSON_CASES])
def test_bad_input_with_json(case: Case, shared: dict[str, object], tmp_path: Path) -> None:
    """With --json every failure, a command-line mistake included, prints exactly one JSON
    object on stdout, with the exit code the command exits with."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ctx = Ctx(
        ws=ws,
        tok=shared["tok"],  # type: ignore[arg-type]
        wordpiece=shared["wordpiece"],  # type: ignore[arg-type]
        corpus=shared["corpus"],  # type: ignore[arg-type]
        models=shared["models"],  # type: ignore[arg-type]
        swag=shared["swag"],  # type: ignore[arg-type]
        reference=shared["reference"],  # type: ignore[arg-type]
    )
    outcome = invoke([*case.build(ctx), "--json"])
    shown = f"lmctl {' '.join(outcome.argv)}\n{outcome.output[-3000:]}"
    assert not outcome.traceback, shown
    assert outcome.code in (case.code, *case.alternatives), shown
    lines = [line for line in outcome.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, shown
    payload = json.loads(lines[0])
    assert payload["exit_code"] == outcome.code, shown
    if outcome.code:
        assert payload["status"] == "error" and case.needle in payload["error"], shown


def check(case: Case, outcome: Outcome, changed: list[str]) -> None:
    shown = f"lmctl {' '.join(outcome.argv)}\n{outcome.output[-3000:]}"
    assert not outcome.traceback, shown
    assert outcome.code in (case.code, *case.alternatives), shown
    assert not changed, f"files changed: {changed}\n{shown}"
    if outcome.code == 0:
        return
    errors = outcome.errors()
    if errors:
        assert len(errors) == 1, shown
        message = errors[0]
        assert "(hint: " in message, shown
    else:
        # a usage error found by the command-line parser itself
        usage = [
            line for line in outcome.stderr.splitlines() if "Error" in line or "No such" in line
        ]
        assert usage, shown
        message = outcome.stderr
    assert len(message) < 2000, f"message of {len(message)} characters\n{shown[:3000]}"
    assert case.needle in message, shown
