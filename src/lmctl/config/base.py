"""The validated configuration shared by every training objective.

Field names are the upstream script argument names (snake_case), so that a JSON args file
written for ``run_clm.py`` validates unchanged. Objectives subclass :class:`TrainConfig`
with their own fields and cross-field rules (see ``lmctl/objectives/``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lmctl import secrets
from lmctl.config.fields import (
    PANEL_DATA,
    PANEL_EVAL,
    PANEL_MODEL,
    PANEL_PUBLISH,
    PANEL_SCALE,
    PANEL_TRAINING,
    flag_name,
    option,
)
from lmctl.storage.paths import (
    data_extension,
    has_glob,
    is_remote,
    local_folder,
    local_folder_problem,
    local_path,
    matching_files,
    url_scheme,
)

DATA_EXTENSIONS = ("txt", "csv", "json", "jsonl", "parquet")
LrScheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "warmup_stable_decay",
]
Strategy = Literal["no", "steps", "epoch"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Engine = Literal["trainer", "accelerate"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
FsdpSharding = Literal["full", "hybrid", "grad-op"]
Launcher = Literal["torchrun", "accelerate"]
#: lmctl's faster ways to train the same model (``lmctl.fastpaths`` decides where each
#: runs); ``--fast-paths`` takes ``auto``, ``off`` or a comma-separated list of these.
FastPathName = Literal[
    "tiled-loss",
    "fused-linear-loss",
    "masked-head",
    "skip-padding",
    "sparse-embedding",
    "fast-dropout",
    "fused-gelu",
    "fused-adamw",
    "allocator",
]
FAST_PATH_CHOICES = ("auto", "off")
#: ``--deepspeed`` values that name a config shipped with lmctl (ZeRO stage 1, 2 or 3).
DEEPSPEED_STAGES = ("1", "2", "3")
#: ``training_args`` keys (TrainingArguments fields) that the accelerate engine honours too.
ACCELERATE_TRAINING_ARGS = frozenset(
    {"adam_beta1", "adam_beta2", "adam_epsilon", "lr_scheduler_kwargs", "use_cpu"}
)
#: Schedules that need ``training_args.lr_scheduler_kwargs``: name -> keys, one of which is needed.
SCHEDULER_KWARGS = {
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps",),
}
_OVERRIDE_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^,=]*$")


def _require_package(problems: Problems, package: str, flag: str) -> None:
    """An optional extra that a flag needs; found without importing it."""
    from importlib.util import find_spec

    if find_spec(package) is None:
        problems.add(
            f"{flag} needs the {package} package, which is not installed",
            f"pip install 'lmctl[{package}]'",
        )


class Problems:
    """Collects every problem in a config so that the user sees them all at once.

    ``command`` is the command the config is validated for: ``lmctl prepare`` needs a
    tokenizer and data but no model, and never streams.
    """

    def __init__(self, command: str = "train") -> None:
        self.items: list[tuple[str, str]] = []
        self.command = command

    def add(self, message: str, hint: str) -> None:
        self.items.append((message, hint))

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigProblems(self.items)


class ConfigProblems(ValueError):
    """Raised inside validators; the loader turns it into one ConfigError."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(message for message, _ in items))
        self.items = items


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, protected_namespaces=())


class TrainConfig(StrictModel):
    """Options shared by every ``lmctl train`` objective."""

    objective: ClassVar[str] = ""

    # Model
    model_name_or_path: str | None = option(
        None,
        "Pretrained model: a local directory, a Hub id or a storage URL (s3://, gs://, ...). "
        "Leave unset to train from scratch.",
        panel=PANEL_MODEL,
        flags=("--model",),
    )
    model_type: str | None = option(
        None,
        "Architecture to build from scratch (gpt2, llama, bert, ...).",
        panel=PANEL_MODEL,
    )
    config_overrides: str | None = option(
        None,
        "Comma-separated key=value overrides of the from-scratch model config, "
        "e.g. n_layer=2,n_embd=64.",
        panel=PANEL_MODEL,
    )
    config_name: str | None = option(
        None, "Model config to use if not the model's own (directory or Hub id).", panel=PANEL_MODEL
    )
    tokenizer_name: str | None = option(
        None,
        "Tokenizer to use if not the model's own (directory, Hub id or storage URL).",
        panel=PANEL_MODEL,
        flags=("--tokenizer",),
    )
    train_tokenizer: int | None = option(
        None,
        "Train a new tokenizer with this vocabulary size on the training data "
        "(from-scratch training only); it is saved with the model.",
        panel=PANEL_MODEL,
        gt=0,
    )
    cache_dir: str | None = option(
        None, "Where downloaded models and datasets are cached.", panel=PANEL_MODEL
    )
    use_fast_tokenizer: bool = option(
        True, "Use a fast (Rust) tokenizer when one exists.", panel=PANEL_MODEL
    )
    model_revision: str = option(
        "main", "Model revision: a branch, tag or commit id.", panel=PANEL_MODEL
    )
    token: SecretStr | None = option(
        None,
        "Hub token (defaults to HF_TOKEN or the cached login). Never written anywhere.",
        panel=PANEL_MODEL,
        secret=True,
        exclude=True,
    )
    trust_remote_code: bool = option(
        False,
        "Allow models and datasets that run their own code from the Hub or a local directory.",
        panel=PANEL_MODEL,
    )
    dtype: Dtype | None = option(
        None,
        "Load a pretrained model in this dtype ('auto' takes it from the checkpoint).",
        panel=PANEL_MODEL,
    )
    imports: list[str] = option(
        [],
        "Python module to import first (a module name or a .py file), e.g. one that "
        "registers a custom architecture with the Auto classes for --model-type; repeatable.",
        panel=PANEL_MODEL,
        flags=("--import",),
    )

    # Data
    dataset_name: str | None = option(
        None, "Dataset on the Hub (or a local dataset script/directory).", panel=PANEL_DATA
    )
    dataset_config_name: str | None = option(
        None, "Configuration name of --dataset-name.", panel=PANEL_DATA
    )
    train_file: str | None = option(
        None,
        "Training data: a txt, csv, json, jsonl or parquet file (a path or a storage URL), or "
        "a pattern such as 'data/*.txt' for several.",
        panel=PANEL_DATA,
    )
    validation_file: str | None = option(
        None,
        "Evaluation data: a txt, csv, json, jsonl or parquet file (a path or a storage URL).",
        panel=PANEL_DATA,
    )
    text_column: str | None = option(
        None,
        "Column holding the text (default: 'text' if present, else the first column).",
        panel=PANEL_DATA,
    )
    max_train_samples: int | None = option(
        None,
        "Keep only the first N training samples, counted as upstream counts them: blocks "
        "after grouping (clm, mlm, plm), samples after tokenizing with --line-by-line, "
        "records for swag; also with --streaming.",
        panel=PANEL_DATA,
        gt=0,
    )
    max_eval_samples: int | None = option(
        None,
        "Keep only the first N evaluation samples, counted like --max-train-samples.",
        panel=PANEL_DATA,
        gt=0,
    )
    validation_split_percentage: int = option(
        5,
        "Percent of the training data held out for evaluation when there is no validation split.",
        panel=PANEL_DATA,
        ge=0,
        lt=100,
    )
    preprocessing_num_workers: int | None = option(
        None,
        "Processes used for tokenization (default: one per CPU core and 4 MB of text).",
        panel=PANEL_DATA,
        gt=0,
    )
    overwrite_cache: bool = option(
        False, "Redo preprocessing instead of reusing the cache.", panel=PANEL_DATA
    )
    prepared_cache_dir: str | None = option(
        None,
        "Where tokenized and grouped data is cached (default: $LMCTL_CACHE/prepared, else "
        "~/.cache/lmctl/prepared). 'lmctl prepare' fills it; train reuses a matching entry.",
        panel=PANEL_DATA,
    )
    streaming: bool = option(
        False,
        "Stream the data: read, tokenize and group it on the fly in bounded memory, each rank "
        "and dataloader worker reading its own shards (needs --max-steps).",
        panel=PANEL_DATA,
    )
    shuffle_buffer_size: int = option(
        1000,
        "With --streaming: examples shuffled together, in windows of each shard; the shard "
        "order is shuffled with --seed too (0: read in order).",
        panel=PANEL_DATA,
        ge=0,
    )

    # Training
    engine: Engine = option("trainer", "Training engine.", panel=PANEL_TRAINING)
    output_dir: str | None = option(
        None,
        "Run directory (default: runs/<objective>-<date>-<time>): a local folder, or a "
        "storage URL (s3://, gs://, file://, any fsspec protocol) that each checkpoint and "
        "the final model are uploaded to.",
        panel=PANEL_TRAINING,
        flags=("-o",),
    )
    staging_dir: str | None = option(
        None,
        "With a storage URL as --output-dir: the local folder the run is written into before "
        "it is uploaded (default: a folder per URL under $LMCTL_CACHE_DIR/runs, else "
        "~/.cache/lmctl/runs).",
        panel=PANEL_TRAINING,
    )
    overwrite_output_dir: bool = option(
        False, "Allow writing into a non-empty output directory.", panel=PANEL_TRAINING
    )
    resume_from_checkpoint: str | None = option(
        None,
        "Continue from a checkpoint directory, or 'auto' for the newest in --output-dir.",
        panel=PANEL_TRAINING,
    )
    do_train: bool = option(True, "Train.", panel=PANEL_TRAINING, flags=("--do-train/--no-train",))
    do_eval: bool = option(
        True, "Evaluate after training.", panel=PANEL_TRAINING, flags=("--do-eval/--no-eval",)
    )
    per_device_train_batch_size: int = option(
        8, "Training batch size per device.", panel=PANEL_TRAINING, gt=0
    )
    per_device_eval_batch_size: int = option(
        8, "Evaluation batch size per device.", panel=PANEL_TRAINING, gt=0
    )
    learning_rate: float = option(5e-5, "Peak learning rate (AdamW).", panel=PANEL_TRAINING, gt=0)
    weight_decay: float = option(
        0.0,
        "AdamW weight decay (never applied to biases and LayerNorm weights).",
        panel=PANEL_TRAINING,
        ge=0,
    )
    num_train_epochs: float = option(3.0, "Training epochs.", panel=PANEL_TRAINING, gt=0)
    max_steps: int | None = option(
        None, "Total optimizer steps; overrides --num-train-epochs.", panel=PANEL_TRAINING, gt=0
    )
    gradient_accumulation_steps: int = option(
        1, "Batches accumulated per optimizer step.", panel=PANEL_TRAINING, gt=0
    )
    lr_scheduler_type: LrScheduler = option(
        "linear", "Learning-rate schedule.", panel=PANEL_TRAINING
    )
    warmup_steps: int = option(0, "Linear warmup steps.", panel=PANEL_TRAINING, ge=0)
    warmup_ratio: float | None = option(
        None,
        "Warmup as a fraction of total steps (instead of --warmup-steps).",
        panel=PANEL_TRAINING,
        ge=0,
        lt=1,
    )
    max_grad_norm: float = option(
        1.0, "Gradient clipping norm (0 disables).", panel=PANEL_TRAINING, ge=0
    )
    seed: int = option(42, "Random seed.", panel=PANEL_TRAINING)
    bf16: bool = option(False, "bfloat16 mixed precision.", panel=PANEL_TRAINING)
    fp16: bool = option(False, "float16 mixed precision (CUDA).", panel=PANEL_TRAINING)
    precision: Precision | None = option(
        None,
        "auto: bfloat16 autocast where the CPU or GPU computes it natively, else fp32 (unset: "
        "fp32, or what --bf16/--fp16 say).",
        panel=PANEL_TRAINING,
    )
    group_by_length: bool = option(
        False,
        "Batch samples of similar length together (less padding, but less learned per step).",
        panel=PANEL_TRAINING,
    )
    torch_compile: bool = option(
        False, "Compile the model with torch.compile.", panel=PANEL_TRAINING
    )
    fast_paths: str = option(
        "auto",
        "Faster ways to train the same model: auto (each on the device types where it was "
        "measured faster), off (the model's and PyTorch's own code), or a comma-separated "
        "list of those to use wherever they fit: "
        + ", ".join(get_args(FastPathName))
        + ". The log says which run and why.",
        panel=PANEL_TRAINING,
    )
    dataloader_num_workers: int = option(
        0, "Dataloader worker processes.", panel=PANEL_TRAINING, ge=0
    )
    report_to: list[str] = option(
        [],
        "Experiment trackers to log to (tensorboard, wandb, mlflow, ..., or all); repeat the flag.",
        panel=PANEL_TRAINING,
    )
    with_tracking: bool = option(
        False,
        "Log to experiment trackers: those of --report-to, or every installed one when "
        "--report-to is not given.",
        panel=PANEL_TRAINING,
    )
    training_args: dict[str, Any] = option(
        {},
        "Extra transformers TrainingArguments fields (config file only).",
        panel=PANEL_TRAINING,
        cli=False,
    )

    # Evaluation and checkpoints
    logging_steps: float = option(
        10, "Log every N steps (a value below 1 is a fraction of the run).", panel=PANEL_EVAL, gt=0
    )
    eval_strategy: Strategy = option("no", "When to evaluate during training.", panel=PANEL_EVAL)
    eval_steps: float | None = option(
        None, "Evaluate every N steps with --eval-strategy steps.", panel=PANEL_EVAL, gt=0
    )
    save_strategy: Strategy = option("steps", "When to save checkpoints.", panel=PANEL_EVAL)
    save_steps: float = option(500, "Save a checkpoint every N steps.", panel=PANEL_EVAL, gt=0)
    checkpointing_steps: str | None = option(
        None,
        "Save a checkpoint every N steps, or 'epoch' (or 'no'): the no_trainer spelling of "
        "--save-strategy/--save-steps, which it sets.",
        panel=PANEL_EVAL,
    )
    save_total_limit: int | None = option(
        None,
        "Keep at most N checkpoints; the newest, and the best one with "
        "load_best_model_at_end, are never deleted.",
        panel=PANEL_EVAL,
        gt=0,
    )

    # Publishing
    push_to: str | None = option(
        None,
        "Publish the final model when training ends: hf://NAMESPACE/REPO or a storage URL "
        "(s3://, gs://, oss://, hdfs://, file:///). Write access is checked before training.",
        panel=PANEL_PUBLISH,
    )
    push_private: bool = option(
        False, "Create the Hub repository of --push-to as private.", panel=PANEL_PUBLISH
    )

    # Processes, sharding and adapters
    nproc: int | None = option(
        None,
        "Run on N processes of this machine: re-runs the same command under the launcher "
        "(--launcher), printing the equivalent launcher command first.",
        panel=PANEL_SCALE,
        gt=0,
    )
    nnodes: int = option(1, "Machines taking part (with --nproc).", panel=PANEL_SCALE, gt=0)
    node_rank: int = option(
        0, "This machine's rank among --nnodes (0 on the first).", panel=PANEL_SCALE, ge=0
    )
    master_addr: str | None = option(
        None,
        "Address of the machine of --node-rank 0 (needed with --nnodes above 1).",
        panel=PANEL_SCALE,
    )
    master_port: int | None = option(
        None, "Port on --master-addr for the process group.", panel=PANEL_SCALE, gt=0, lt=65536
    )
    launcher: Launcher = option(
        "torchrun",
        "Launcher that --nproc runs: torchrun (python -m torch.distributed.run) or accelerate "
        "(accelerate launch).",
        panel=PANEL_SCALE,
    )
    max_restarts: int = option(
        0,
        "With --nproc: when a process fails, restart every process from the newest complete "
        "checkpoint, up to N times (torchrun's elastic agent).",
        panel=PANEL_SCALE,
        ge=0,
    )
    deepspeed: str | None = option(
        None,
        "DeepSpeed ZeRO: a DeepSpeed config JSON file, or 1, 2 or 3 for the shipped config of "
        "that stage ('auto' values filled from the flags). Needs lmctl[deepspeed].",
        panel=PANEL_SCALE,
    )
    fsdp: bool = option(
        False, "Shard the model with PyTorch FSDP (version 2, fully_shard).", panel=PANEL_SCALE
    )
    fsdp_sharding: FsdpSharding = option(
        "full",
        "With --fsdp: shard parameters, gradients and optimizer state (full), full sharding "
        "inside a node and replication across nodes (hybrid), or gradients and optimizer "
        "state only (grad-op).",
        panel=PANEL_SCALE,
    )
    fsdp_auto_wrap: bool = option(
        False,
        "With --fsdp: shard each transformer layer separately (the model's own layer classes).",
        panel=PANEL_SCALE,
    )
    fsdp_cpu_offload: bool = option(
        False, "With --fsdp: keep parameters and gradients in CPU memory.", panel=PANEL_SCALE
    )
    gradient_checkpointing: bool = option(
        False,
        "Recompute activations in the backward pass: less memory, about a third more compute.",
        panel=PANEL_SCALE,
    )
    peft: Literal["lora"] | None = option(
        None,
        "Parameter-efficient fine-tuning: train a LoRA adapter instead of every weight. "
        "Needs lmctl[peft].",
        panel=PANEL_SCALE,
    )
    lora_r: int = option(8, "With --peft lora: the adapter's rank.", panel=PANEL_SCALE, gt=0)
    lora_alpha: int = option(
        16, "With --peft lora: the scaling numerator (scale = alpha / r).", panel=PANEL_SCALE, gt=0
    )
    lora_dropout: float = option(
        0.05, "With --peft lora: dropout on the adapter's input.", panel=PANEL_SCALE, ge=0, lt=1
    )
    lora_target_modules: list[str] = option(
        [],
        "With --peft lora: module names to adapt, repeatable (default: the attention "
        "projections of the architecture family, e.g. c_attn for GPT-2, query/value for BERT).",
        panel=PANEL_SCALE,
    )
    merge_adapter: bool = option(
        False,
        "With --peft lora: also write the adapter merged into full weights (merged/ in the run "
        "directory), loadable by plain transformers.",
        panel=PANEL_SCALE,
    )

    @model_validator(mode="before")
    @classmethod
    def _upstream_sentinels(cls, data: Any) -> Any:
        """Upstream scripts write -1 for "unset" step counts."""
        if isinstance(data, dict):
            for key in ("max_steps", "eval_steps", "save_total_limit"):
                if data.get(key) in (-1, "-1"):
                    data = {**data, key: None}
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, value: Any) -> Any:
        """Upstream accepts "none", "all", "tensorboard" or "wandb,tensorboard"."""
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list):
            value = [item for item in value if item != "none"]
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_trainer_spellings(cls, data: Any) -> Any:
        """``checkpointing_steps N|epoch`` sets the save strategy that both engines honour; it is
        then cleared so the resolved config says it one way only."""
        if not isinstance(data, dict):
            return data
        value = data.get("checkpointing_steps")
        if value is None:
            return data
        data = {**data, "checkpointing_steps": None}
        text = str(value).strip().lower()
        if text in ("epoch", "no"):
            data["save_strategy"] = text
        elif text.isdigit() and int(text) > 0:
            data["save_strategy"] = "steps"
            data["save_steps"] = int(text)
        else:
            raise ConfigProblems(
                [
                    (
                        f"--checkpointing-steps {value}: not a number of steps or 'epoch'",
                        "e.g. --checkpointing-steps 500 or --checkpointing-steps epoch",
                    )
                ]
            )
        return data

    @field_validator("fast_paths", mode="before")
    @classmethod
    def _fast_path_list(cls, value: Any) -> Any:
        """``tiled-loss, fused-gelu`` and ``Tiled-Loss,fused-gelu`` say the same."""
        if isinstance(value, str):
            return ",".join(item.strip().lower() for item in value.split(","))
        return value

    @field_validator("imports")
    @classmethod
    def _absolute_module_files(cls, value: list[str]) -> list[str]:
        """A .py file is recorded by its absolute path, so the saved config works anywhere."""
        return [
            str(local_path(name).resolve())
            if name.endswith(".py") and local_path(name).is_file()
            else name
            for name in value
        ]

    @field_validator("resume_from_checkpoint", "prepared_cache_dir", "cache_dir", "staging_dir")
    @classmethod
    def _plain_local_folder(cls, value: str | None) -> str | None:
        """``file:///abs`` names the local folder ``/abs``; other URLs are refused in check."""
        return None if value is None else local_folder(value)

    @field_validator("deepspeed")
    @classmethod
    def _absolute_deepspeed_file(cls, value: str | None) -> str | None:
        """A DeepSpeed config file is recorded by its absolute path, for resume from anywhere."""
        if value is None or value in DEEPSPEED_STAGES or not local_path(value).is_file():
            return value
        return str(local_path(value).resolve())

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> TrainConfig:
        problems = Problems((info.context or {}).get("command", "train"))
        self.check(problems)
        problems.raise_if_any()
        if self.with_tracking and not self.report_to:
            self.report_to = ["all"]
        return self

    def check(self, problems: Problems) -> None:
        """Upstream cross-field rules; objectives extend this and call ``super().check``."""
        from_pretrained = self.model_name_or_path is not None
        if self.config_overrides is not None:
            if from_pretrained or self.config_name is not None:
                problems.add(
                    "--config-overrides can't be used with --model-name-or-path or --config-name",
                    "drop --config-overrides, or train from scratch with --model-type",
                )
            else:
                for item in self.config_overrides.split(","):
                    if not _OVERRIDE_ITEM.match(item.strip()):
                        problems.add(
                            f"--config-overrides: '{item}' is not key=value",
                            "write it as comma-separated key=value pairs, e.g. n_layer=2,n_head=4",
                        )
                        break
        preparing = problems.command == "prepare"
        has_model = from_pretrained or self.config_name is not None or self.model_type is not None
        if not has_model and not preparing:
            problems.add(
                "no model: give --model-name-or-path, --config-name or --model-type",
                "e.g. --model ./my-model, or --model-type gpt2 to train from scratch",
            )
        if self.train_tokenizer is not None:
            if from_pretrained:
                problems.add(
                    "--train-tokenizer only applies when training from scratch",
                    "drop --train-tokenizer; a pretrained model keeps its own tokenizer",
                )
            if self.tokenizer_name is not None:
                problems.add(
                    "--train-tokenizer and --tokenizer-name can't be used together",
                    "choose one: train a new tokenizer or load an existing one",
                )
        elif not from_pretrained and self.tokenizer_name is None:
            problems.add(
                "preparing data needs a tokenizer"
                if preparing
                else "training from scratch needs a tokenizer",
                "give --tokenizer-name DIR, or --train-tokenizer VOCAB_SIZE to train one on "
                "the training data",
            )
        no_data = (
            self.dataset_name is None and self.train_file is None and self.validation_file is None
        )
        if no_data:
            problems.add(
                "no data: give --dataset-name or --train-file/--validation-file",
                "e.g. --train-file corpus.txt",
            )
        for name in ("train_file", "validation_file"):
            path = getattr(self, name)
            if path is None:
                continue
            ext = data_extension(path)
            if ext not in DATA_EXTENSIONS:
                problems.add(
                    f"{flag_name(name)} {path}: unsupported file type '.{ext}'",
                    "use a " + ", ".join(DATA_EXTENSIONS) + " file",
                )
            elif not is_remote(path) and not matching_files(path):
                problems.add(
                    f"{flag_name(name)} {path}: "
                    + ("no file matches" if has_glob(path) else "no such file"),
                    "check the path (relative paths start from the current directory)",
                )
        if (
            self.train_file is not None
            and self.validation_file is not None
            and data_extension(self.train_file) != data_extension(self.validation_file)
        ):
            problems.add(
                "--train-file and --validation-file must have the same file type",
                "convert one of them so both are txt, csv, json/jsonl or parquet",
            )
        # With no data at all, the one "no data" problem above says it all.
        if not no_data and self.do_train and self.train_file is None and not self.dataset_name:
            problems.add("--do-train needs training data", "give --train-file or --dataset-name")
        if (
            not no_data
            and self.train_tokenizer is not None
            and self.train_file is None
            and not self.dataset_name
        ):
            problems.add("--train-tokenizer needs training data to learn from", "give --train-file")
        for name in self.imports:
            if name.endswith(".py") and not local_path(name).is_file():
                problems.add(f"--import {name}: no such file", "check the path of the .py file")
        if self.bf16 and self.fp16:
            problems.add("--bf16 and --fp16 can't both be set", "choose one precision")
        elif self.precision is not None and (self.bf16 or self.fp16):
            flag = "--bf16" if self.bf16 else "--fp16"
            if self.precision != flag[2:]:
                problems.add(f"--precision {self.precision} contradicts {flag}", "keep one of them")
        if self.warmup_ratio is not None and self.warmup_steps:
            problems.add(
                "--warmup-ratio and --warmup-steps can't both be set", "choose one warmup form"
            )
        if self.eval_strategy == "steps" and self.eval_steps is None:
            problems.add("--eval-strategy steps needs --eval-steps", "e.g. --eval-steps 100")
        self._check_schedule(problems)
        self._check_fast_paths(problems)
        if self.engine == "accelerate":
            ignored = sorted(set(self.training_args) - ACCELERATE_TRAINING_ARGS)
            if ignored:
                problems.add(
                    f"training_args {', '.join(ignored)} (or --{', --'.join(ignored)}): not "
                    "used by --engine accelerate (it takes "
                    f"{', '.join(sorted(ACCELERATE_TRAINING_ARGS))})",
                    "remove them, or use --engine trainer",
                )
        self._check_scale(problems)
        if not (self.do_train or self.do_eval):
            problems.add("nothing to do: both training and evaluation are off", "drop --no-train")
        if self.push_to is not None:
            self._check_push(problems)
        if self.streaming and preparing:
            problems.add(
                "lmctl prepare fills the cache that non-streaming runs read; it does not stream",
                "drop 'streaming' from the config",
            )
        elif self.streaming and self.do_train and self.max_steps is None:
            problems.add(
                "--streaming needs --max-steps: a stream has no length to count epochs in",
                "give the number of optimizer steps, e.g. --max-steps 10000",
            )
        self._check_locations(problems)
        if self.resume_from_checkpoint not in (None, "auto"):
            ckpt = self.resume_from_checkpoint
            if url_scheme(ckpt) is None and not local_path(ckpt).is_dir():
                problems.add(
                    f"--resume-from-checkpoint {ckpt}: no such directory",
                    "give a checkpoint directory, or 'auto' for the newest in --output-dir",
                )

    def _check_locations(self, problems: Problems) -> None:
        """Folder options given a URL: the run directory may be remote (see
        :mod:`lmctl.storage.locations`), the others live on the local disk; no URL is ever
        taken for a local path."""
        from lmctl.storage.locations import run_location_problem

        found = [run_location_problem("--output-dir", self.output_dir)]
        found.append(
            local_folder_problem(
                "--resume-from-checkpoint",
                self.resume_from_checkpoint,
                "to continue a run kept in a bucket, run 'lmctl resume URL'",
            )
        )
        for name in ("prepared_cache_dir", "cache_dir", "staging_dir"):
            found.append(
                local_folder_problem(
                    flag_name(name), getattr(self, name), "give a folder on the local disk"
                )
            )
        found.append(
            local_folder_problem(
                "training_args.logging_dir",
                self.training_args.get("logging_dir"),
                "give a folder on the local disk (by default the logs go into the run "
                "directory's runs/ folder)",
            )
        )
        for problem in found:
            if problem is not None:
                problems.add(*problem)

    def _changed(self, name: str) -> bool:
        return bool(getattr(self, name) != type(self).model_fields[name].default)

    def _check_scale(self, problems: Problems) -> None:
        """Launcher, sharding and adapter rules (see ``lmctl.run.launch`` and the engines)."""
        if self.nproc is None:
            for name in ("nnodes", "node_rank", "master_addr", "master_port", "max_restarts"):
                if self._changed(name):
                    problems.add(
                        f"{flag_name(name)} only applies with --nproc",
                        "add --nproc N (processes per machine), or drop it",
                    )
        if self.nnodes > 1 and self.master_addr is None:
            problems.add(
                f"--nnodes {self.nnodes} needs --master-addr",
                "give the address of the machine started with --node-rank 0",
            )
        if self.node_rank >= self.nnodes:
            problems.add(
                f"--node-rank {self.node_rank} is not below --nnodes {self.nnodes}",
                "number the machines 0 .. nnodes-1",
            )
        if self.deepspeed is not None:
            if self.fsdp:
                problems.add(
                    "--deepspeed and --fsdp can't be used together", "choose one way to shard"
                )
            if self.deepspeed not in DEEPSPEED_STAGES and not local_path(self.deepspeed).is_file():
                problems.add(
                    f"--deepspeed {self.deepspeed}: no such file, and not a ZeRO stage",
                    "give a DeepSpeed config .json file, or 1, 2 or 3 for a shipped one",
                )
        if self.deepspeed is not None or "deepspeed" in self.training_args:
            _require_package(problems, "deepspeed", "--deepspeed")
        if self.fsdp and self.fsdp_sharding == "hybrid" and self.engine == "accelerate":
            problems.add(
                "--fsdp-sharding hybrid is not available with --engine accelerate",
                "use --engine trainer, or --fsdp-sharding full",
            )
        if not self.fsdp:
            for name in ("fsdp_sharding", "fsdp_auto_wrap", "fsdp_cpu_offload"):
                if self._changed(name):
                    problems.add(f"{flag_name(name)} needs --fsdp", "add --fsdp, or drop it")
        if self.peft is None:
            for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
                if self._changed(name):
                    problems.add(f"{flag_name(name)} needs --peft lora", "add --peft lora")
            if self.merge_adapter:
                problems.add("--merge-adapter needs --peft lora", "add --peft lora")
        else:
            _require_package(problems, "peft", "--peft")
            if self.model_name_or_path is None and problems.command != "prepare":
                problems.add(
                    "--peft lora adapts a pretrained model",
                    "give --model-name-or-path, or train every weight (drop --peft)",
                )

    def fast_path_names(self) -> frozenset[str] | None:
        """The paths a ``--fast-paths`` list names (None for auto and off)."""
        if self.fast_paths in FAST_PATH_CHOICES:
            return None
        return frozenset(self.fast_paths.split(","))

    def _check_fast_paths(self, problems: Problems) -> None:
        known = get_args(FastPathName)
        unknown = sorted((self.fast_path_names() or frozenset()) - set(known))
        if unknown:
            problems.add(
                f"--fast-paths {self.fast_paths}: {', '.join(repr(n) for n in unknown)} "
                f"{'is not a fast path' if len(unknown) == 1 else 'are not fast paths'}",
                f"give auto, off, or a comma-separated list of: {', '.join(known)}",
            )

    def _check_schedule(self, problems: Problems) -> None:
        if self.lr_scheduler_type == "reduce_lr_on_plateau" and self.eval_strategy == "no":
            problems.add(
                "--lr-scheduler-type reduce_lr_on_plateau needs evaluations during training",
                "add --eval-strategy epoch (or steps with --eval-steps)",
            )
        needed = SCHEDULER_KWARGS.get(self.lr_scheduler_type)
        given = self.training_args.get("lr_scheduler_kwargs") or {}
        if needed and not any(key in given for key in needed):
            problems.add(
                f"--lr-scheduler-type {self.lr_scheduler_type} needs "
                f"training_args.lr_scheduler_kwargs.{' or '.join(needed)}",
                f"set it in the config file, e.g. training_args: {{lr_scheduler_kwargs: "
                f"{{{needed[0]}: ...}}}}",
            )

    def _check_push(self, problems: Problems) -> None:
        from lmctl.errors import ConfigError
        from lmctl.storage.locations import parse_location

        assert self.push_to is not None
        try:
            location = parse_location(self.push_to, "--push-to")
        except ConfigError as exc:
            problems.add(exc.message, exc.hint or "")
            return
        if self.push_private and not location.is_hub:
            problems.add(
                "--push-private only applies to a Hub destination (hf://)",
                "drop --push-private, or push to hf://NAMESPACE/REPO",
            )
        if not self.do_train:
            problems.add(
                "--push-to needs --do-train: there is no trained model to publish",
                "drop --push-to, or publish an existing model with 'lmctl push DIR --to DEST'",
            )

    def resolved_output_dir(self) -> str:
        if self.output_dir is not None:
            return self.output_dir
        return os.path.join("runs", f"{self.objective}-{datetime.now():%Y%m%d-%H%M%S}")

    def mixed_precision(self, native_bf16: Callable[[], bool]) -> Literal["bf16", "fp16"] | None:
        """The autocast dtype to train in (None: fp32); ``native_bf16`` asks the hardware,
        and only for --precision auto."""
        requested = self.precision or ("bf16" if self.bf16 else "fp16" if self.fp16 else "fp32")
        if requested == "auto":
            return "bf16" if native_bf16() else None
        return None if requested == "fp32" else requested

    def token_value(self) -> str | None:
        if self.token is not None:
            secrets.register(self.token.get_secret_value())
            return self.token.get_secret_value()
        return None
