"""The upstream example scripts' recipe, re-created as a user runs them, for side-by-side runs.

``run_clm.py``, ``run_mlm.py``, ``run_plm.py`` and ``run_swag.py`` (transformers examples) do,
with default arguments: ``load_dataset`` of the files, ``Dataset.map`` tokenization with the
tokenizer's default threading, ``itertools.chain`` grouping (clm, mlm without --line_by_line),
``DataCollatorForLanguageModeling`` / the multiple-choice collator, a ``Trainer`` with default
``TrainingArguments`` besides the flags given, and ``preprocess_logits_for_metrics`` that
reduces logits to argmax predictions before they are gathered. ``evaluate.load("accuracy")``
needs the Hub, so the same accuracy module is loaded from the file lmctl ships (identical
computation).

    python benchmarks/upstream.py clm|mlm|plm|swag|eval-clm --model DIR --train-file F ... \
        --out R.json

Writes the Trainer's metrics (``train_runtime``, ``eval_runtime``, ...) plus token counts to
``--out``; with ``--eval-steps N``, also ``curve``: ``[step, training seconds, eval loss]`` at
every evaluation, the seconds counted from the start of training without the evaluations.
The Trainer of transformers 5 divides a causal LM's summed loss by the number of labels of
the batch, shifted-out first positions included, so its clm eval loss is the per-token mean
times ``(block - 1) / block``; ``eval_loss`` here is the per-token mean (the Trainer's figure
divided by that factor), the quantity lmctl reports, so the two compare.
``run_plm.py --line_by_line`` works only with ``--pad_to_max_length`` (its collator refuses an
odd batch length), so the plm recipe pads every line to ``--max-seq-length``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

ACCURACY = Path(__file__).resolve().parent.parent / "src/lmctl/metrics/accuracy"


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=["clm", "mlm", "plm", "swag", "eval-clm"])
    parser.add_argument("--model", required=True, help="a model directory (config + tokenizer)")
    parser.add_argument("--from-config", action="store_true", help="initialise from config.json")
    parser.add_argument("--train-file")
    parser.add_argument("--validation-file")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--line-by-line", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--eval-steps", type=int, help="evaluate every N steps (a loss curve)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--seed", type=int, default=42, help="the Trainer's seed")
    parser.add_argument("--endings", type=int, default=4, help="swag: ending0..ending{N-1}")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def group_recipe(raw: Any, tokenizer: Any, block_size: int, text: str, workers: int | None) -> Any:
    """run_clm.py's tokenize_function and group_texts."""

    def tokenize_function(examples: dict[str, list[Any]]) -> Any:
        return tokenizer(examples[text])

    tokenized = raw.map(
        tokenize_function,
        batched=True,
        num_proc=workers,
        remove_columns=[text],
        load_from_cache_file=False,
    )

    def group_texts(examples: dict[str, list[Any]]) -> dict[str, Any]:
        concatenated = {k: list(itertools.chain(*examples[k])) for k in examples}
        total_length = len(concatenated[next(iter(examples))])
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    return tokenized.map(group_texts, batched=True, num_proc=workers, load_from_cache_file=False)


def line_recipe(
    raw: Any,
    tokenizer: Any,
    max_length: int,
    text: str,
    workers: int | None,
    *,
    padding: bool | str = False,
) -> Any:
    """run_mlm.py's and run_plm.py's tokenize_function with --line_by_line."""

    def tokenize_function(examples: dict[str, list[Any]]) -> Any:
        examples[text] = [line for line in examples[text] if len(line) > 0 and not line.isspace()]
        return tokenizer(
            examples[text],
            padding=padding,
            truncation=True,
            max_length=max_length,
            return_special_tokens_mask=True,
        )

    return raw.map(
        tokenize_function,
        batched=True,
        num_proc=workers,
        remove_columns=[text],
        load_from_cache_file=False,
    )


class LossCurve:
    """A Trainer callback: the eval loss at every evaluation against the seconds of training
    so far, evaluations left out; ``scale`` turns the Trainer's loss into the per-token mean."""

    def __new__(cls, scale: float) -> Any:
        from transformers import TrainerCallback

        class Curve(TrainerCallback):  # type: ignore[misc]
            def __init__(self) -> None:
                self.points: list[list[float]] = []
                self.started = 0.0
                self.evaluating = 0.0

            def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
                self.started = time.perf_counter()

            def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                metrics = kwargs.get("metrics") or {}
                if "eval_loss" not in metrics or not self.started:
                    return
                self.evaluating += metrics.get("eval_runtime", 0.0)
                seconds = time.perf_counter() - self.started - self.evaluating
                self.points.append([state.global_step, seconds, metrics["eval_loss"] * scale])

        return Curve()


def main() -> int:
    started = time.perf_counter()
    args = _args()
    import datasets
    import evaluate
    import torch
    import transformers
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    auto = {
        "clm": transformers.AutoModelForCausalLM,
        "eval-clm": transformers.AutoModelForCausalLM,
        "mlm": transformers.AutoModelForMaskedLM,
        "plm": transformers.XLNetLMHeadModel,
        "swag": transformers.AutoModelForMultipleChoice,
    }[args.task]
    if args.from_config:
        model = auto.from_config(AutoConfig.from_pretrained(args.model))
    else:
        model = auto.from_pretrained(args.model)
    files = {}
    if args.train_file:
        files["train"] = args.train_file
    if args.validation_file:
        files["validation"] = args.validation_file
    extension = Path(next(iter(files.values()))).suffix.lstrip(".")
    builder = {"txt": "text", "jsonl": "json"}.get(extension, extension)
    line_by_line = args.task in ("mlm", "plm")
    options = {"keep_linebreaks": True} if builder == "text" and not line_by_line else {}
    raw = datasets.load_dataset(builder, data_files=files, **options)
    column_names = list(raw[next(iter(raw))].features)
    metric = evaluate.load(str(ACCURACY))

    def preprocess_logits_for_metrics(logits: Any, labels: Any) -> Any:
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    compute_metrics: Any = None
    if args.task in ("clm", "eval-clm"):
        text = "text" if "text" in column_names else column_names[0]

        dataset = group_recipe(raw, tokenizer, args.block_size, text, workers=None)
        collator = transformers.default_data_collator

        def compute_metrics(eval_preds: Any) -> Any:
            preds, labels = eval_preds
            labels = labels[:, 1:].reshape(-1)
            preds = preds[:, :-1].reshape(-1)
            return metric.compute(predictions=preds, references=labels)

    elif line_by_line:
        text = "text" if "text" in column_names else column_names[0]
        assert args.line_by_line, "the benchmark runs mlm and plm line by line"

        plm = args.task == "plm"
        padding = "max_length" if plm else False
        dataset = line_recipe(raw, tokenizer, args.max_seq_length, text, None, padding=padding)
        if plm:
            collator = transformers.DataCollatorForPermutationLanguageModeling(
                tokenizer=tokenizer, plm_probability=1 / 6, max_span_length=5
            )
        else:
            # run_mlm.py pads to a multiple of 8 under fp16 only.
            collator = transformers.DataCollatorForLanguageModeling(
                tokenizer=tokenizer, mlm_probability=0.15, pad_to_multiple_of=None
            )

        def compute_metrics(eval_preds: Any) -> Any:
            preds, labels = eval_preds
            labels = labels.reshape(-1)
            preds = preds.reshape(-1)
            mask = labels != -100
            return metric.compute(predictions=preds[mask], references=labels[mask])

    else:
        count = args.endings
        endings = [f"ending{i}" for i in range(count)]

        def preprocess_function(examples: dict[str, list[Any]]) -> Any:
            first = [[context] * count for context in examples["sent1"]]
            headers = examples["sent2"]
            second = [
                [f"{header} {examples[end][i]}" for end in endings]
                for i, header in enumerate(headers)
            ]
            first = list(itertools.chain(*first))
            second = list(itertools.chain(*second))
            tokenized = tokenizer(
                first, second, truncation=True, max_length=args.max_seq_length, padding=False
            )
            return {
                k: [v[i : i + count] for i in range(0, len(v), count)] for k, v in tokenized.items()
            }

        dataset = raw.map(preprocess_function, batched=True)
        collator = transformers.DataCollatorForMultipleChoice(tokenizer=tokenizer)
        preprocess_logits_for_metrics = None  # type: ignore[assignment]

        def compute_metrics(eval_predictions: Any) -> Any:
            import numpy as np

            predictions, label_ids = eval_predictions
            preds = np.argmax(predictions, axis=1)
            return {"accuracy": (preds == label_ids).astype(np.float32).mean().item()}

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        do_train=args.task != "eval-clm",
        do_eval="validation" in dataset,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        max_steps=args.max_steps,
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        bf16=args.bf16,
        # transformers 5 refuses bf16 without a GPU unless the CPU is named.
        use_cpu=args.bf16 and not torch.cuda.is_available(),
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        **({"eval_strategy": "steps", "eval_steps": args.eval_steps} if args.eval_steps else {}),
    )
    # Per-token mean of a causal LM's eval loss (see the module's docstring).
    scale = args.block_size / (args.block_size - 1) if args.task in ("clm", "eval-clm") else 1.0
    curve = LossCurve(scale)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset.get("train"),
        eval_dataset=dataset.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=[curve] if args.eval_steps else None,
    )
    results: dict[str, Any] = {}
    if training_args.do_train:
        results.update(trainer.train().metrics)
        results["train_samples"] = len(dataset["train"])
        if args.task == "mlm":
            results["train_tokens"] = sum(len(ids) for ids in dataset["train"]["input_ids"])
    if training_args.do_eval:
        results.update(trainer.evaluate())
        results["eval_loss"] *= scale
    if args.eval_steps:
        results["curve"] = curve.points
    results["wall"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
