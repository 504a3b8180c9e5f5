"""``lmctl data inspect <objective>``: the entry point, the findings and their rendering.

Each split's head is tokenized with the run's tokenizer; clm (and mlm/plm without
``--line-by-line``) concatenates its texts and cuts them into blocks, so the lengths shown
are those of the raw lines and the cut is the remainder dropped after the last full block;
line by line (and swag) every sample is cut at ``--max-seq-length``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import install_hint
from lmctl.errors import ConfigError
from lmctl.inspection import measure
from lmctl.inspection.sample import Head, read_heads

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from lmctl.config.base import TrainConfig
    from lmctl.config.slices import DataSpec, LoopSpec
    from lmctl.console import Console
    from lmctl.objectives.base import Objective

DEFAULT_SAMPLE = 20000
#: More unknown tokens than this share spoil training.
UNKNOWN_LIMIT = 0.05
#: More of the tokens cut than this share spoil training.
CUT_LIMIT = 0.5


def inspect_data(
    name: str,
    config: TrainConfig,
    console: Console,
    *,
    sample: int,
    plot: str | None,
) -> dict[str, Any]:
    """Read, tokenize and measure the head of each split; the result object of the command."""
    from lmctl.config.slices import slice_config

    if sample <= 0:
        raise ConfigError(f"--sample {sample}: must be positive", "e.g. --sample 20000")
    if plot is not None:
        _check_plot(plot)
    from lmctl.objectives import get_objective

    objective = get_objective(name)
    spec = slice_config(config, objective.options_class)
    records = name == "swag"
    heads = read_heads(spec.data, spec.access, sample, records=records)
    given = spec.data.validation_file or spec.data.dataset_name or spec.data.validation_sources
    if not given:
        console.info(
            "validation: held out from the training data (--validation-split-percentage); "
            "the train sample stands for it"
        )
    tokenizer, model_config = _tokenizer(spec, objective, heads, console)
    from lmctl.objectives.common import resolve_sequence_length

    options = spec.options
    flag = "--block-size" if name == "clm" else "--max-seq-length"
    requested = options.block_size if name == "clm" else options.max_seq_length
    length = resolve_sequence_length(requested, flag, tokenizer, model_config, console)
    grouped = name == "clm" or (name in ("mlm", "plm") and not options.line_by_line)
    splits: dict[str, Any] = {}
    warnings: list[str] = []

    def measured(head: Head) -> dict[str, Any]:
        if records:
            return _swag_split(head, options, tokenizer, length, spec.loop)
        return _text_split(head, tokenizer, length, grouped, spec.loop)

    for head in heads:
        report = measured(head)
        warnings += [f"{head.split}: {text}" for text in _findings(report, flag, grouped)]
        if head.parts:
            parts = {part.split: measured(part) for part in head.parts}
            report["sources"] = _source_shares(head, parts, spec.data)
            for source, part in parts.items():
                found = _findings(part, flag, grouped)
                warnings += [f"{head.split} source {source}: {text}" for text in found]
        splits[head.split] = report
    result = {
        "objective": name,
        "tokenizer": getattr(tokenizer, "name_or_path", None) or str(type(tokenizer).__name__),
        "length_flag": flag,
        "length": length,
        "grouped": grouped,
        "splits": splits,
        "warnings": warnings,
    }
    from lmctl.inspection.render import render

    render(result, console)
    for text in warnings:
        console.warn(text)
    if plot is not None:
        result["plot"] = _write_plot(plot, splits, name)
        console.info(f"histogram written to {result['plot']}")
    return result


def _tokenizer(
    spec: Any, objective: Objective[Any], heads: list[Head], console: Console
) -> tuple[PreTrainedTokenizerBase, Any]:
    from transformers import PretrainedConfig

    from lmctl.models.config import build_model_config
    from lmctl.models.plugins import load_plugins
    from lmctl.models.tokenizer import check_tokenizer_files, load_tokenizer

    if (
        spec.tokenizer.tokenizer_name is None
        and spec.tokenizer.train_tokenizer is None
        and spec.model.model_name_or_path is None
    ):
        raise ConfigError(
            "no tokenizer: give --tokenizer-name, --model-name-or-path or --train-tokenizer",
            "e.g. --tokenizer-name ./tok",
        )
    check_tokenizer_files(spec.tokenizer, spec.model)
    load_plugins(spec.model.imports, console)  # they may register the tokenizer's class
    model_config = (
        build_model_config(spec.model, spec.access, console)
        if spec.model.given
        else PretrainedConfig()
    )
    texts = [text for head in heads if head.split == "train" for text in _texts_of(head)]

    def training_texts() -> Any:
        for start in range(0, len(texts), measure.BATCH):
            yield texts[start : start + measure.BATCH]

    tokenizer = load_tokenizer(
        objective,
        model_config,
        training_texts,
        console,
        tokenizer_spec=spec.tokenizer,
        model_spec=spec.model,
        access=spec.access,
        world_size=1,
        overwrite_cache=True,
    )
    return tokenizer, model_config


def _texts_of(head: Head) -> list[str]:
    if head.texts:
        return head.texts
    return [str(value) for record in head.records for value in record.values() if value]


def _text_split(
    head: Head,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    grouped: bool,
    loop: LoopSpec,
) -> dict[str, Any]:
    samples = [text for text in head.texts if text.strip()]
    tokenized = measure.tokenize_texts(tokenizer, samples)
    lengths = tokenized.lengths
    report: dict[str, Any] = {
        "source": head.where,
        "read": head.describe(),
        "lines_read": head.read,
        "complete": head.complete,
        "estimated_lines": head.estimated_total,
        "unit": "line" if grouped else "sample",
        **measure.distribution(lengths),
        "histogram": measure.histogram(lengths),
        **measure.line_counts(head.texts),
        "unknown": measure.unknown_report(tokenized, tokenizer.unk_token),
    }
    if grouped:
        report["cut"] = measure.blocks(lengths, length)
        report["padding"] = {
            "batch_size": loop.per_device_train_batch_size,
            "padding_share": 0.0,
            "padding_share_grouped": 0.0,
            "note": "texts are concatenated and split into full blocks: nothing is padded",
        }
    else:
        report["cut"] = measure.cut(lengths, length)
        report["padding"] = measure.padding(
            [min(value, length) for value in lengths], loop.per_device_train_batch_size, loop.seed
        )
    return report


def _swag_split(
    head: Head,
    options: Any,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    loop: LoopSpec,
) -> dict[str, Any]:
    from lmctl.objectives.swag import check_columns, label_value, question_column

    endings = options.endings
    rows = head.records
    columns = list(rows[0]) if rows else []
    if rows:
        check_columns(options, columns, head.where)
    question = question_column(options, columns)
    contexts = [str(row[options.context_column] or "") for row in rows]
    firsts = [context for context in contexts for _ in endings]
    seconds = [
        f"{row[question] or '' if question else ''} {row[ending] or ''}".strip()
        for row in rows
        for ending in endings
    ]
    tokenized = measure.tokenize_texts(tokenizer, firsts, seconds)
    choices = tokenized.lengths
    per_record = [max(choices[i : i + len(endings)]) for i in range(0, len(choices), len(endings))]
    labels: Counter[Any] = Counter()
    for row in rows:
        value = label_value(row.get(options.label_column), len(endings))
        labels["invalid" if value is None else value] += 1
    balance = {str(key): labels.get(key, 0) for key in range(len(endings))}
    if labels.get("invalid"):
        balance["invalid"] = labels["invalid"]
    context_lengths = measure.tokenize_texts(tokenizer, contexts).lengths
    cut_choices = [min(value, length) for value in choices]
    return {
        "source": head.where,
        "read": head.describe(),
        "lines_read": head.read,
        "complete": head.complete,
        "estimated_lines": head.estimated_total,
        "unit": "record",
        "endings": len(endings),
        **measure.distribution(per_record),
        # Every choice's tokens; the distribution is of each record's longest choice.
        "tokens": sum(choices),
        "histogram": measure.histogram(per_record),
        "context": measure.distribution(context_lengths),
        "labels": balance,
        "missing_labels": [key for key in range(len(endings)) if not labels.get(key)],
        "unknown": measure.unknown_report(tokenized, tokenizer.unk_token),
        "cut": {**measure.cut(choices, length), "unit": "choice"},
        "padding": measure.padding(
            [min(value, length) for value in per_record],
            loop.per_device_train_batch_size,
            loop.seed,
            real=[
                sum(cut_choices[i : i + len(endings)])
                for i in range(0, len(cut_choices), len(endings))
            ],
            sequences=len(endings),
        ),
    }


def _source_shares(
    head: Head, parts: dict[str, dict[str, Any]], data: DataSpec
) -> dict[str, dict[str, Any]]:
    """Each source's share of the split's samples and tokens. Training sources are drawn by
    weight, so their shares are those of the mixture (a source's weight, and its weight times
    its mean tokens per sample); validation sources are read whole, so theirs are those of the
    samples read."""
    from lmctl.data.mixture import mixture_weights

    if head.split == "train":
        samples = dict(zip(parts, mixture_weights(data.train_sources), strict=True))
        tokens = {name: samples[name] * part["mean"] for name, part in parts.items()}
    else:
        samples = {name: float(part["samples"]) for name, part in parts.items()}
        tokens = {name: float(part["tokens"]) for name, part in parts.items()}
    out = {}
    for name, part in parts.items():
        out[name] = {
            "read": part["read"],
            **{key: part[key] for key in ("samples", "tokens", "mean", "p50", "p90", "max")},
            "sample_share": _fraction(samples[name], sum(samples.values())),
            "token_share": _fraction(tokens[name], sum(tokens.values())),
            "by": "weight" if head.split == "train" else "samples read",
        }
    return out


def _fraction(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def _findings(report: dict[str, Any], flag: str, grouped: bool) -> list[str]:
    found = []
    unknown = report["unknown"]["unknown_share"]
    if unknown > UNKNOWN_LIMIT:
        found.append(
            f"{unknown:.1%} of the tokens are unknown ({report['unknown']['unk_token']}): the "
            "tokenizer does not cover this text; use another --tokenizer-name or train one "
            "with --train-tokenizer"
        )
    cut = report["cut"]
    share = cut["tokens_cut_share"]
    if share > CUT_LIMIT and grouped:
        found.append(
            f"{share:.1%} of the tokens are dropped: the texts make only {cut['blocks']} "
            f"full blocks of {cut['limit']} tokens; lower {flag} (or give more data)"
        )
    elif share > CUT_LIMIT:
        found.append(
            f"{share:.1%} of the tokens are cut at {flag} {cut['limit']}: the model never "
            f"sees them; raise {flag}"
        )
    for label in report.get("missing_labels", []):
        found.append(
            f"label {label} never appears in the {report['lines_read']} records read: the "
            "model never learns that choice; check --label-column and --ending-columns"
        )
    return found


def _check_plot(plot: str) -> None:
    import importlib.util

    if not plot.lower().endswith(".png"):
        raise ConfigError(
            f"--plot {plot}: the histogram is written as PNG", "e.g. --plot lengths.png"
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot needs matplotlib, which is not installed", install_hint("plot"))
    folder = Path(plot).expanduser().resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"--plot {plot}: no folder {folder}", "create it or choose another path")


def _write_plot(plot: str, splits: dict[str, Any], name: str) -> str:
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from lmctl.storage.atomic import atomic_write

    figure = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    axes = figure.subplots()
    for split, report in splits.items():
        bins = report["histogram"]
        if not bins:
            continue
        axes.bar(
            [item["low"] for item in bins],
            [item["count"] for item in bins],
            width=[item["high"] - item["low"] + 1 for item in bins],
            align="edge",
            alpha=0.6,
            label=split,
        )
    axes.set_xlabel(f"tokens per {next(iter(splits.values()))['unit']}" if splits else "tokens")
    axes.set_ylabel("samples")
    axes.set_title(f"lmctl data inspect {name}")
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    path = Path(plot).expanduser().resolve()
    atomic_write(path, buffer.getvalue())
    return str(path)
