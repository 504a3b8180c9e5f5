"""Multiple choice (``run_swag.py``): BERT-family models with a multiple-choice head.

Each record has a context, an optional question header and two or more endings; the label
is the index of the right ending. The context is paired with "header + ending" for every
choice, all pairs are tokenized flat and regrouped to (records, choices). Without
``--train-file``/``--dataset-name`` the Hub dataset ``swag`` (config ``regular``) is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import field_validator, model_validator

from lmctl.config.base import Problems
from lmctl.config.fields import PANEL_DATA, PANEL_OBJECTIVE, option
from lmctl.config.slices import take
from lmctl.data.load import cached_map, record_location, tokenizer_fingerprint
from lmctl.errors import ConfigError, DataError
from lmctl.objectives.base import Objective
from lmctl.objectives.common import (
    SequenceConfig,
    SequenceOptions,
    resolve_sequence_length,
)
from lmctl.storage.paths import data_extension

if TYPE_CHECKING:
    from collections.abc import Iterator

    from datasets import Dataset, DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.slices import DataSpec, LoopSpec
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics

DEFAULT_DATASET = ("swag", "regular")
DEFAULT_QUESTION_COLUMN = "sent2"
RECORD_EXTENSIONS = ("csv", "json", "jsonl", "parquet")


class SwagConfig(SequenceConfig):
    objective: ClassVar[str] = "swag"

    context_column: str = option(
        "sent1", "Column holding the context, paired with every choice.", panel=PANEL_DATA
    )
    question_column: str = option(
        DEFAULT_QUESTION_COLUMN,
        "Column holding a question header put before every ending ('' for none; when the "
        "default column is absent there is none).",
        panel=PANEL_DATA,
    )
    ending_columns: str = option(
        "ending0,ending1,ending2,ending3",
        "Comma-separated columns holding the choices (two or more).",
        panel=PANEL_DATA,
    )
    label_column: str = option(
        "label", "Column holding the 0-based index of the right choice.", panel=PANEL_DATA
    )
    pad_to_max_length: bool = option(
        False,
        "Pad every choice to --max-seq-length instead of to the longest in its batch "
        "(fixed shapes).",
        panel=PANEL_OBJECTIVE,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_dataset(cls, data: Any) -> Any:
        """Like upstream: the Hub's SWAG when no data is named (named sources included)."""
        named = ("dataset_name", "train_file", "validation_file")
        if isinstance(data, dict) and not any(
            data.get(key) for key in (*named, "train_sources", "validation_sources")
        ):
            name, config_name = DEFAULT_DATASET
            data = {**data, "dataset_name": name}
            data.setdefault("dataset_config_name", config_name)
        return data

    @field_validator("ending_columns", mode="before")
    @classmethod
    def _endings_from_list(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)
        return value

    @property
    def endings(self) -> list[str]:
        return take(SwagOptions, self).endings

    def check(self, problems: Problems) -> None:
        super().check(problems)
        endings = self.endings
        if len(endings) < 2:
            problems.add(
                f"--ending-columns {self.ending_columns}: needs two or more columns",
                "list the choice columns separated by commas, e.g. ending0,ending1,ending2",
            )
        if len(set(endings)) != len(endings):
            problems.add(
                f"--ending-columns {self.ending_columns}: a column is listed twice",
                "list each choice column once",
            )
        others = {self.context_column, self.label_column}
        if others & set(endings) or self.context_column == self.label_column:
            problems.add(
                "--context-column, --ending-columns and --label-column must name different columns",
                "check the column flags",
            )
        for name in ("train_file", "validation_file"):
            path = getattr(self, name)
            if path is not None and data_extension(path) == "txt":
                problems.add(
                    f"--{name.replace('_', '-')} {path}: multiple choice needs records with "
                    "columns, not plain text",
                    "use a csv, json, jsonl or parquet file",
                )


@dataclass(frozen=True)
class SwagOptions(SequenceOptions):
    context_column: str
    question_column: str
    ending_columns: str
    label_column: str
    pad_to_max_length: bool

    @property
    def endings(self) -> list[str]:
        return [name.strip() for name in self.ending_columns.split(",") if name.strip()]


def label_value(value: Any, choices: int) -> int | None:
    """The label as a choice index, or None when it isn't one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value < choices:
        return value
    return None


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _header(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _encode_choices(
    examples: dict[str, list[Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    context: str,
    question: str | None,
    endings: list[str],
    label: str,
    max_length: int,
    pad_to_max_length: bool,
) -> dict[str, Any]:
    choices = len(endings)
    contexts = examples[context]
    headers = examples[question] if question else [None] * len(contexts)
    firsts = [text for text in contexts for _ in range(choices)]
    seconds = [
        f"{_header(header)} {examples[ending][i]}".strip()
        for i, header in enumerate(headers)
        for ending in endings
    ]
    encoded = tokenizer(
        firsts,
        seconds,
        truncation=True,
        max_length=max_length,
        padding="max_length" if pad_to_max_length else False,
    )
    out: dict[str, Any] = {
        key: [values[i : i + choices] for i in range(0, len(values), choices)]
        for key, values in encoded.items()
    }
    out["labels"] = [label_value(value, choices) for value in examples[label]]
    return out


def _encoder(
    options: SwagOptions, tokenizer: PreTrainedTokenizerBase, question: str | None, length: int
) -> Any:
    return partial(
        _encode_choices,
        tokenizer=tokenizer,
        context=options.context_column,
        question=question,
        endings=options.endings,
        label=options.label_column,
        max_length=length,
        pad_to_max_length=options.pad_to_max_length,
    )


BAD_RECORD_HINT = (
    "fix or remove those records, or the column flags (--label-column, --ending-columns)"
)


def question_column(options: SwagOptions, columns: list[str]) -> str | None:
    """The question header column, if the data has one."""
    name = options.question_column
    if not name or (name == DEFAULT_QUESTION_COLUMN and name not in columns):
        return None
    return name


def _columns_of(data: Any) -> list[str]:
    """The columns of a loaded split, or of a stream's record source."""
    columns = getattr(data, "column_names", None)
    return list(columns if columns is not None else data.columns or [])


def check_columns(options: SwagOptions, columns: list[str], where: str) -> None:
    """Every column the flags name is in the data; those that are not are named together."""
    listed = ", ".join(columns)
    required = [
        (options.context_column, "--context-column"),
        *[(name, "--ending-columns") for name in options.endings],
        (options.label_column, "--label-column"),
    ]
    question = question_column(options, columns)
    if question is not None:
        required.insert(1, (question, "--question-column"))
    missing = [(column, flag) for column, flag in required if column not in columns]
    if missing:
        names = [f"'{column}'" for column, _ in missing]
        shown = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        flags = ", ".join(dict.fromkeys(flag for _, flag in missing))
        raise DataError(f"{where}: no column {shown} (columns: {listed})", f"fix {flags}")


def bad_records(options: SwagOptions, columns: dict[str, list[Any]]) -> list[tuple[int, str]]:
    """(index, reason) of every record with a missing text or a label that is no choice, by
    index."""
    choices = len(options.endings)
    bad: list[tuple[int, str]] = []
    for name in (options.context_column, *options.endings):
        for index, value in enumerate(columns[name]):
            if _missing(value):
                bad.append((index, f"'{name}' is missing"))
    for index, value in enumerate(columns[options.label_column]):
        if label_value(value, choices) is None:
            shown = "missing" if value is None else repr(value)
            reason = f"label {shown} is not a choice (0 to {choices - 1} for {choices} endings)"
            bad.append((index, reason))
    return sorted(bad)


def _encode_streamed(
    records: list[dict[str, Any]],
    *,
    where: str,
    options: SwagOptions,
    needed: list[str],
    encode: Any,
) -> dict[str, Any]:
    """A batch of streamed records, checked like loaded ones, then encoded."""
    columns = {name: [record.get(name) for record in records] for name in needed}
    bad = bad_records(options, columns)
    if bad:
        index, reason = bad[0]
        shown = json.dumps(records[index], default=str)[:120]
        raise DataError(f"{where}: record {shown}: {reason}", BAD_RECORD_HINT)
    return dict(encode(columns))


def _choice(predictions: Any, labels: Any) -> tuple[Any, Any]:
    return predictions, labels


class Swag(Objective[SwagOptions]):
    name = "swag"
    summary = "Multiple choice (SWAG-style: a context and two or more endings)"
    task_tag = "multiple-choice"
    config_class = SwagConfig
    options_class = SwagOptions
    tokenizer_algorithm = "wordpiece"
    reports_perplexity = False
    example_models = "bert, roberta, distilbert, albert"
    streams_records = True

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForMultipleChoice

        return AutoModelForMultipleChoice

    def check_records(
        self, options: SwagOptions, dataset: Dataset, where: str, path: str | None
    ) -> None:
        check_columns(options, list(dataset.column_names), where)
        columns = {name: dataset[name] for name in (options.context_column, *options.endings)}
        columns[options.label_column] = dataset[options.label_column]
        bad = bad_records(options, columns)
        if bad:
            index, reason = bad[0]
            records = sorted({i for i, _ in bad})
            more = f" ({len(records) - 1} more bad records)" if len(records) > 1 else ""
            raise DataError(
                f"{where}, {record_location(path, index)}: {reason}{more}", BAD_RECORD_HINT
            )

    def training_texts(
        self, options: SwagOptions, data: DataSpec, train: Any, where: str
    ) -> Iterator[list[str]]:
        question = question_column(options, _columns_of(train))
        columns = [options.context_column, *([question] if question else []), *options.endings]
        if data.streaming:
            yield from train.texts(columns=columns)
            return
        for start in range(0, len(train), 1000):
            batch = train[start : start + 1000]
            yield [text for column in columns for text in batch[column] if text]

    def check_model(
        self,
        options: SwagOptions,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        source: str,
    ) -> None:
        if tokenizer.pad_token is None:
            raise ConfigError(
                f"{source}: the tokenizer has no padding token, which batching the choices needs",
                "use a BERT-style tokenizer, or --train-tokenizer when training from scratch",
            )

    def preprocess(
        self,
        options: SwagOptions,
        raw: DatasetDict,
        tokenizer: PreTrainedTokenizerBase,
        model_config: PretrainedConfig,
        console: Console,
        *,
        data: DataSpec,
        loop: LoopSpec,
    ) -> DatasetDict:
        import datasets

        length = resolve_sequence_length(
            options.max_seq_length, "--max-seq-length", tokenizer, model_config, console
        )
        console.info(f"max sequence length: {length} tokens per choice")
        if data.streaming:
            return self._stream(options, raw, tokenizer, length, console, data=data, loop=loop)
        tokenizer_key = tokenizer_fingerprint(tokenizer)
        processed = {}
        for split, dataset in raw.items():
            question = question_column(options, list(dataset.column_names))
            processed[split] = cached_map(
                dataset,
                _encoder(options, tokenizer, question, length),
                key=(
                    "choices",
                    tokenizer_key,
                    options.context_column,
                    question,
                    options.endings,
                    options.label_column,
                    length,
                    options.pad_to_max_length,
                ),
                data=data,
                description=f"tokenizing {split}",
                remove_columns=list(dataset.column_names),
            )
            console.info(
                f"{split}: {len(dataset)} records x {len(options.endings)} choices "
                f"({data.source(split)})"
            )
        return datasets.DatasetDict(processed)

    def _stream(
        self,
        options: SwagOptions,
        raw: Any,
        tokenizer: PreTrainedTokenizerBase,
        length: int,
        console: Console,
        *,
        data: DataSpec,
        loop: LoopSpec,
    ) -> Any:
        """Records read, checked and tokenized on the fly (``--streaming``); the columns are
        checked on each split's first record before any work."""
        from lmctl.data import stream

        encoders: dict[str, stream.Encoder] = {}
        for split, source in raw.items():
            check_columns(options, source.columns or [], source.where)
            question = question_column(options, source.columns or [])
            encoders[split] = partial(
                _encode_streamed,
                where=source.where,
                options=options,
                needed=[
                    options.context_column,
                    *([question] if question else []),
                    *options.endings,
                    options.label_column,
                ],
                encode=_encoder(options, tokenizer, question, length),
            )
        return stream.example_streams(data, raw, encoders, console, seed=loop.seed, unit="record")

    def collator(
        self, options: SwagOptions, tokenizer: PreTrainedTokenizerBase, pad_multiple: int | None
    ) -> Any:
        if options.pad_to_max_length:
            from transformers import default_data_collator

            return default_data_collator
        from transformers import DataCollatorForMultipleChoice

        return DataCollatorForMultipleChoice(tokenizer=tokenizer, pad_to_multiple_of=pad_multiple)

    def metrics(self) -> BatchMetrics:
        from lmctl.metrics import BatchMetrics

        return BatchMetrics(_choice)


OBJECTIVE = Swag()
