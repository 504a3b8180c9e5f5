"""Loading raw data and the preprocessing steps every objective shares.

Raw data comes from local files (txt, csv, json, jsonl, parquet) or a Hub dataset. The
result is a ``DatasetDict`` with ``train`` and, when evaluation is on, ``validation`` (held
out from train by ``--validation-split-percentage`` when the data has none). Tokenized data
is cached by :mod:`lmctl.data.prepared`; :func:`cached_map` keys a single ``datasets`` map step
on an explicit fingerprint (input data, tokenizer content, parameters, lmctl version) for
preprocessing steps that live inside such a cached build. Streaming runs read their data
through :mod:`lmctl.data.stream` instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import __version__
from lmctl.errors import ConfigError, DataError
from lmctl.storage import hub
from lmctl.storage.paths import data_extension, has_glob, is_remote, local_path

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedTokenizerBase

    from lmctl.config.slices import Access, DataSpec
    from lmctl.console import Console

BUILDERS = {"txt": "text", "csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}


#: Called with (dataset, where, file path or None) for each split as loaded, before the
#: validation hold-out and sample limits, so that record numbers still match the file.
RecordCheck = Callable[["Dataset", str, "str | None"], None]


def load_raw(
    data: DataSpec,
    access: Access,
    *,
    do_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    check_records: RecordCheck | None = None,
    loaded: dict[str, Any] | None = None,
) -> DatasetDict:
    """Load the user's data as ``train``/``validation`` splits. ``loaded``: the splits of named
    sources (:func:`lmctl.data.mixture.load_named_sources`, each source checked as it was
    read), which then go through the same checks and hold-out as files."""
    import datasets

    files = data_files(data)
    if loaded is not None:
        raw = loaded
        source = {split: data.source(split) for split in loaded}
        check_records = None
    elif data.dataset_name is not None:
        raw = load_hub_dataset(data.dataset_name, data.dataset_config_name, access)
        source = {"train": f"--dataset-name {data.dataset_name}"}
    else:
        raw = load_files(files, text_options, access.cache_dir)
        source = files
    if check_records is not None:
        for split in ("train", "validation"):
            if split in raw:
                path = files.get(split)
                where = path or f"--dataset-name {data.dataset_name} [{split}]"
                check_records(raw[split], where, path)
    if do_train and "train" in raw and len(raw["train"]) == 0:
        raise DataError(
            f"{source.get('train', 'training data')}: no records (the data is empty)",
            "give a file with at least one non-empty record",
        )
    if need_eval and "validation" not in raw:
        raw = _hold_out_validation(raw, data.validation_split_percentage)
    if need_eval and len(raw["validation"]) == 0:
        raise DataError(
            f"{source.get('validation', 'evaluation data')}: no records (the data is empty)",
            "give a validation file with at least one record, or --no-eval",
        )
    return datasets.DatasetDict(
        {
            split: dataset
            for split, dataset in raw.items()
            if split in ("train", "validation") or split.startswith("validation_")
        }
    )


def data_files(data: DataSpec) -> dict[str, str]:
    """The files given for each split (``--train-file``, ``--validation-file``)."""
    files = {"train": data.train_file, "validation": data.validation_file}
    return {split: path for split, path in files.items() if path is not None}


def sample_limit(data: DataSpec, split: str) -> int | None:
    """``--max-train-samples`` or ``--max-eval-samples``, whichever applies to ``split``."""
    return data.max_train_samples if split == "train" else data.max_eval_samples


def limit_samples(data: DataSpec, splits: Any, console: Console) -> Any:
    """The first ``--max-train-samples``/``--max-eval-samples`` model samples of each split,
    counted as upstream counts them: after tokenizing (and grouping into blocks)."""
    import datasets

    out = {}
    for split, dataset in splits.items():
        limit = sample_limit(data, split)
        out[split] = dataset
        if limit is not None and limit < len(dataset):
            flag = "--max-train-samples" if split == "train" else "--max-eval-samples"
            console.info(f"{split}: keeping the first {limit} of {len(dataset)} samples ({flag})")
            out[split] = dataset.select(range(limit))
    return datasets.DatasetDict(out)


def load_files(files: dict[str, str], text_options: dict[str, Any], cache_dir: str | None) -> Any:
    """The data files of each split (``files``: split -> path, glob or URL), all of one type."""
    import datasets

    local_files = {split: _localize(path, f"--{split}-file") for split, path in files.items()}
    for split, path in local_files.items():
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            raise DataError(
                f"{files[split]}: no records (the file is empty)",
                "give a file with at least one record",
            )
    extension = data_extension(next(iter(files.values())))
    builder = BUILDERS[extension]
    kwargs: dict[str, Any] = dict(text_options) if builder == "text" else {}
    try:
        return datasets.load_dataset(builder, data_files=local_files, cache_dir=cache_dir, **kwargs)
    except Exception as exc:
        for split, path in local_files.items():
            _explain_bad_file(path, extension, files[split], exc)
        raise DataError(
            f"{', '.join(files.values())}: could not be read as {extension} ({_root_cause(exc)})",
            f"check that the file is valid {extension}",
        ) from exc


def _localize(path: str, flag: str) -> str:
    """Remote files are fetched into lmctl's cache first (see
    :func:`lmctl.storage.locations.localize`)."""
    from lmctl.storage import locations

    return str(locations.localize(path, f"{flag} {path}"))


def _explain_bad_file(path: str, extension: str, shown: str, exc: Exception) -> None:
    """Find the first malformed line of a JSON-lines file so the error can name it."""
    if extension not in ("json", "jsonl") or has_glob(path):
        return
    with open(path, encoding="utf-8", errors="replace") as handle:
        first = handle.read(1)
        if first == "[":
            return
        handle.seek(0)
        for number, line in enumerate(handle, 1):
            if line.strip():
                parse_json_record(line, f"{shown}, line {number}")


def parse_json_record(line: str, where: str, *, require_object: bool = True) -> Any:
    """One record of JSON-lines data. ``where`` names the file and, when known, the line; a
    malformed line, or with ``require_object`` a record that is not a JSON object, is a
    DataError that names it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where}: invalid JSON ({exc.msg})",
            "fix that line; each line must be one JSON object",
        ) from exc
    if require_object and not isinstance(record, dict):
        raise DataError(
            f"{where}: expected a JSON object, got {type(record).__name__}",
            'write one object per line, e.g. {"text": "..."}',
        )
    return record


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def load_hub_dataset(name: str, config: str | None, access: Access) -> Any:
    """Every split of the Hub dataset ``name`` (or a local dataset directory)."""
    import datasets

    local = Path(name).expanduser()
    if not local.exists() and not hub.offline_mode():
        hub.require_hub(f"--dataset-name {name}")
    try:
        return datasets.load_dataset(
            name,
            config,
            cache_dir=access.cache_dir,
            token=access.token_value(),
            trust_remote_code=access.trust_remote_code or None,
        )
    except Exception as exc:
        if hub.is_connection_error(exc):
            raise hub.unreachable(f"--dataset-name {name}") from exc
        raise DataError(
            f"--dataset-name {name}: could not load it ({_root_cause(exc)})",
            "check the dataset name and --dataset-config-name",
        ) from exc


def require_hold_out(percentage: int) -> None:
    """Evaluation without validation data holds out a part of train: refuse an empty part."""
    if percentage <= 0:
        raise ConfigError(
            "evaluation is on, there is no validation data and --validation-split-percentage is 0",
            "give --validation-file, a percentage above 0, or --no-eval",
        )


def _hold_out_validation(raw: Any, percentage: int) -> Any:
    import datasets

    require_hold_out(percentage)
    train = raw["train"]
    held = len(train) * percentage // 100
    if len(train) < 2:
        raise DataError(
            "the training data has fewer than 2 records, too few to hold out a validation split",
            "give --validation-file, or more training data",
        )
    held = max(1, held)
    return datasets.DatasetDict(
        {"validation": train.select(range(held)), "train": train.select(range(held, len(train)))}
    )


def text_column(dataset: Dataset, requested: str | None, where: str) -> str:
    """The text column of ``dataset`` (see :func:`choose_column`), checked to hold text."""
    columns = list(dataset.column_names)
    name = choose_column(columns, requested, where)
    feature = dataset.features[name]
    dtype = getattr(feature, "dtype", None)
    if dtype not in ("string", "large_string"):
        raise not_text(where, name, dtype or type(feature).__name__, columns)
    return name


def choose_column(columns: list[str], requested: str | None, where: str) -> str:
    """``--text-column``, else ``text`` if present, else the first column."""
    if requested is None:
        return "text" if "text" in columns else columns[0]
    if requested not in columns:
        raise DataError(
            f"{where}: no column '{requested}' (columns: {', '.join(columns)})",
            "fix --text-column",
        )
    return requested


def not_text(where: str, name: str, holds: str, columns: list[str]) -> DataError:
    return DataError(
        f"{where}: column '{name}' holds {holds}, not text (columns: {', '.join(columns)})",
        "add a 'text' column or name the text column with --text-column",
    )


def iterate_texts(dataset: Dataset, column: str, batch_size: int = 1000) -> Iterator[list[str]]:
    """Non-empty texts of one column in batches (for training a tokenizer)."""
    for start in range(0, len(dataset), batch_size):
        batch = dataset[start : start + batch_size][column]
        yield [text for text in batch if text]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides how the tokenizer splits text."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for file in sorted(Path(tmp).iterdir()):
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def fingerprint(*parts: Any) -> str:
    payload = json.dumps([__version__, *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def cached_map(
    dataset: Dataset,
    function: Callable[..., Any],
    *,
    key: Iterable[Any],
    data: DataSpec,
    description: str,
    remove_columns: list[str] | None = None,
) -> Dataset:
    """``Dataset.map`` keyed on an explicit fingerprint of its inputs and parameters."""
    from lmctl.data.tokens import forked_workers

    with forked_workers() if data.preprocessing_num_workers else nullcontext():
        return dataset.map(
            function,
            batched=True,
            num_proc=data.preprocessing_num_workers,
            remove_columns=remove_columns,
            load_from_cache_file=not data.overwrite_cache,
            new_fingerprint=fingerprint(dataset._fingerprint, *key),
            desc=description,
        )


def group_into_blocks(examples: dict[str, list[list[int]]], block_size: int) -> dict[str, Any]:
    """Concatenate token lists and cut them into ``block_size`` blocks, dropping the rest."""
    import numpy as np

    out: dict[str, Any] = {}
    for column, sequences in examples.items():
        arrays = [np.asarray(sequence, dtype=np.int64) for sequence in sequences if len(sequence)]
        if not arrays:
            out[column] = []
            continue
        flat = np.concatenate(arrays)
        usable = (len(flat) // block_size) * block_size
        # Per-token values may be pairs (offset mappings): keep their trailing shape.
        out[column] = flat[:usable].reshape(-1, block_size, *flat.shape[1:]).tolist()
    return out


def record_location(path: str | None, index: int) -> str:
    """Where the record ``index`` (0-based, in file order) of a data file is, for messages:
    the line of a csv or JSON-lines record, else its record number."""
    number = index + 1
    if path is None or is_remote(path):
        return f"record {number}"
    extension = data_extension(path)
    file = local_path(path)
    try:
        if extension == "csv":
            return _csv_record_line(file, index) or f"record {number}"
        if extension in ("json", "jsonl"):
            with open(file, encoding="utf-8", errors="replace") as handle:
                if handle.read(1) == "[":
                    return f"record {number}"
                handle.seek(0)
                seen = -1
                for line_number, line in enumerate(handle, 1):
                    if line.strip():
                        seen += 1
                        if seen == index:
                            return f"line {line_number}"
    except OSError:
        pass
    return f"record {number}"


def _csv_record_line(file: Path, index: int) -> str | None:
    import csv

    with open(file, encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        previous_end = 0
        seen = -2  # the header row comes first
        for row in reader:
            start = previous_end + 1
            previous_end = reader.line_num
            if not row:
                continue
            seen += 1
            if seen == index:
                return f"line {start}"
    return None


def silence_libraries() -> None:
    """Keep library progress bars and info logs out of lmctl's own output."""
    import torch

    if not torch.accelerator.is_available():
        # DeepSpeed (imported by transformers and peft when installed) otherwise announces on
        # stdout that it picked the CPU, which would break --json output.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
