"""Fuzzing the option table: argv lists and config files built from the real config fields
(every objective's config class, the push options, the resume overrides), with valid and
invalid values, unknown keys and wrong types.

Every example runs a validation-only path in-process (``--dry-run``), so it takes
milliseconds. Whatever the input, the command ends with a documented exit code: never a
traceback, never exit 1, and nothing written where it ran. Hypothesis shrinks a failing
example and prints it (with the seed to reproduce it).
"""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from lmctl.config.fields import field_extra, flag_name
from lmctl.config.push import PushConfig
from lmctl.config.upstream import RENAMED_KEYS, training_argument_fields
from lmctl.errors import ExitCode
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run.resume import RESUME_OVERRIDES
from tests.reliability.harness import Outcome, changed_files, checksums, invoke, record

DOCUMENTED = {int(code) for code in ExitCode} - {int(ExitCode.INTERNAL)}
FUZZ = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.lists(TEXT, max_size=3),
    st.dictionaries(TEXT, st.integers(), max_size=2),
)


def _inner(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def valid_value(info: FieldInfo) -> st.SearchStrategy[Any]:
    """Values of the field's own type (some still out of its range)."""
    inner = _inner(info.annotation)
    if inner is bool:
        return st.booleans()
    if inner is int:
        return st.integers(min_value=-3, max_value=5000)
    if inner is float:
        return st.floats(min_value=-1, max_value=10, allow_nan=False) | st.sampled_from(
            [float("nan"), float("inf")]
        )
    if get_origin(inner) is Literal:
        return st.sampled_from(get_args(inner))
    if get_origin(inner) is list:
        return st.lists(TEXT, max_size=2)
    if get_origin(inner) is dict:
        return st.dictionaries(
            st.sampled_from(sorted(frozenset(training_argument_fields()))), ANY_VALUE, max_size=2
        )
    return TEXT


#: --nnodes MIN:MAX, well formed or not.
MACHINE_RANGE = st.builds("{}:{}".format, st.integers(-1, 3), st.integers(-1, 3)) | st.sampled_from(
    ["1:", ":2", "a:b", "1:2:3"]
)


def value_for(info: FieldInfo) -> st.SearchStrategy[Any]:
    return st.one_of(valid_value(info), valid_value(info), ANY_VALUE)


def cli_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {
        name: info
        for name, info in model.model_fields.items()
        if field_extra(info).get("cli", True) and name not in ("token",)
    }


def flag_strings(name: str, info: FieldInfo) -> list[str]:
    declared = [flag for decl in field_extra(info).get("flags", []) for flag in decl.split("/")]
    if _inner(info.annotation) is bool:
        return declared or [flag_name(name), "--no-" + flag_name(name)[2:]]
    return [flag_name(name), *declared]


@st.composite
def argv_tail(
    draw: st.DrawFn, model: type[BaseModel], only: tuple[str, ...] | None = None
) -> list[str]:
    """A few flags of ``model`` with values: right or wrong types, repeated or unknown."""
    fields = cli_fields(model)
    # A field without a flag of its own (--nnodes MIN:MAX fills min_nnodes) is reached
    # through the flag that sets it.
    names = sorted(name for name in (only if only is not None else fields) if name in fields)
    out: list[str] = []
    for name in draw(st.lists(st.sampled_from(names), max_size=5)):
        info = fields[name]
        flag = draw(st.sampled_from(flag_strings(name, info)))
        if _inner(info.annotation) is bool:
            out.append(flag)
            continue
        value = draw(value_for(info) | MACHINE_RANGE if name == "nnodes" else value_for(info))
        out += [flag, value if isinstance(value, str) else json.dumps(value)]
    if draw(st.integers(0, 9)) == 0:
        out.append("--" + draw(st.from_regex(r"[a-z][a-z-]{1,15}", fullmatch=True)))
    return out


@st.composite
def config_mapping(draw: st.DrawFn, model: type[BaseModel]) -> dict[str, Any]:
    """Config file contents: the model's fields, upstream spellings, misspellings, unknowns."""
    fields = model.model_fields
    keys = st.one_of(
        st.sampled_from(sorted(fields)),
        st.sampled_from(sorted(fields)),
        st.sampled_from(sorted(frozenset(training_argument_fields()) | set(RENAMED_KEYS))),
        st.sampled_from(sorted(fields)).map(lambda key: key[:-1]),
        st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    )
    data: dict[str, Any] = {}
    for key in draw(st.lists(keys, max_size=6, unique=True)):
        info = fields.get(key)
        data[key] = draw(value_for(info) if info is not None else ANY_VALUE)
    return data


def write_config(path: Path, data: dict[str, Any], kind: str) -> Path:
    if kind == "yaml":
        import yaml

        text = yaml.safe_dump(data)
    elif kind == "json":
        text = json.dumps(data)
    elif kind == "toml":
        text = "".join(
            f"{key} = {json.dumps(value)}\n" for key, value in data.items() if value is not None
        )
    else:
        text = json.dumps(data)[::-1]  # not any format at all
    file = path.with_suffix(".json" if kind == "garbage" else f".{kind}")
    file.write_text(text, encoding="utf-8")
    return file


@pytest.fixture(scope="module")
def base(
    bpe_tokenizer: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    ws = tmp_path_factory.mktemp("fuzz-ws")
    return {"tok": bpe_tokenizer, "corpus": corpus, "ws": ws}


def run_example(argv: list[str], ws: Path, keep: set[str]) -> Outcome:
    """Run one example in ``ws``; nothing but the example's own inputs may appear there."""
    before = checksums([ws])
    cwd = os.getcwd()
    os.chdir(ws)
    try:
        outcome = invoke(argv)
    finally:
        os.chdir(cwd)
    changed = [name for name in changed_files(before, checksums([ws])) if name not in keep]
    record(outcome, changed=len(changed))
    shown = f"lmctl {' '.join(map(repr, argv))}\n{outcome.output[-2000:]}"
    assert not outcome.traceback, shown
    assert outcome.code in DOCUMENTED, shown
    assert not changed, f"written during a dry run: {changed}\n{shown}"
    return outcome


def _objective_base(name: str, base: dict[str, Any]) -> list[str]:
    model = "xlnet" if name == "plm" else ("bert" if name in ("mlm", "swag") else "gpt2")
    return [
        "--model-type",
        model,
        "--tokenizer-name",
        str(base["tok"]),
        "--train-file",
        str(base["corpus"]),
    ]


@settings(FUZZ, max_examples=220)
@given(
    command=st.sampled_from(["train", "prepare"]),
    objective=st.sampled_from(sorted(OBJECTIVES)),
    data=st.data(),
)
def test_fuzz_argv(command: str, objective: str, data: st.DataObject, base: dict[str, Any]) -> None:
    model = get_objective(objective).config_class
    tail = data.draw(argv_tail(model), label="flags")
    start = _objective_base(objective, base) if data.draw(st.booleans(), label="base") else []
    argv = [command, objective, *start, *tail, "--dry-run"]
    run_example(argv, base["ws"], set())


@settings(FUZZ, max_examples=200)
@given(
    objective=st.sampled_from(sorted(OBJECTIVES)),
    kind=st.sampled_from(["yaml", "json", "toml", "garbage"]),
    data=st.data(),
)
def test_fuzz_config_file(
    objective: str, kind: str, data: st.DataObject, base: dict[str, Any]
) -> None:
    model = get_objective(objective).config_class
    mapping = data.draw(config_mapping(model), label="config")
    if data.draw(st.booleans(), label="objective key"):
        mapping["objective"] = data.draw(st.sampled_from([*sorted(OBJECTIVES), "nope"]))
    config = write_config(base["ws"] / "fuzz", mapping, kind)
    try:
        flags = data.draw(argv_tail(model), label="flags")
        argv = ["train", objective, *_objective_base(objective, base), "--config", str(config)]
        run_example([*argv, *flags, "--dry-run"], base["ws"], {str(config)})
    finally:
        config.unlink()


@pytest.fixture(scope="module")
def run_for_fuzz(reference_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("fuzz-run") / "run"
    shutil.copytree(reference_run, copy)
    return copy


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzz_resume_overrides(
    data: st.DataObject, run_for_fuzz: Path, base: dict[str, Any]
) -> None:
    from lmctl.config.base import TrainConfig

    tail = data.draw(argv_tail(TrainConfig, only=RESUME_OVERRIDES), label="overrides")
    before = checksums([run_for_fuzz])
    run_example(["resume", str(run_for_fuzz), *tail, "--dry-run"], base["ws"], set())
    assert not changed_files(before, checksums([run_for_fuzz]))


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzz_push_options(data: st.DataObject, run_for_fuzz: Path, base: dict[str, Any]) -> None:
    tail = data.draw(argv_tail(PushConfig), label="flags")
    if "--to" not in tail and data.draw(st.booleans(), label="destination"):
        where = ["file://" + str(base["ws"] / "dest"), "zz://bucket/x", "s3:/bad", "file://"]
        tail = ["--to", data.draw(st.sampled_from(where)), *tail]
    before = checksums([run_for_fuzz])
    run_example(["push", str(run_for_fuzz), *tail, "--dry-run"], base["ws"], set())
    assert not changed_files(before, checksums([run_for_fuzz]))
