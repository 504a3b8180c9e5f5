"""The validated configuration shared by every training objective.

Field names are the upstream script argument names (snake_case), so that a JSON args file
written for ``run_clm.py`` validates unchanged. Objectives subclass :class:`TrainConfig`
with their own fields and cross-field rules (see ``lmctl/objectives/``).
"""

from __future__ import annotations

import os
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

from lmctl import DISTRIBUTION, secrets
from lmctl.config.fields import (
    PANEL_DATA,
    PANEL_EVAL,
    PANEL_MODEL,
    PANEL_PUBLISH,
    PANEL_SCALE,
    PANEL_TRAINING,
    option,
)
from lmctl.config.problems import ConfigProblems, Problems
from lmctl.config.sources import DataSource
from lmctl.config.values import (
    DEEPSPEED_STAGES,
    Dtype,
    Engine,
    FastPathName,
    FsdpSharding,
    Launcher,
    LrScheduler,
    Precision,
    Strategy,
)
from lmctl.storage.paths import local_folder, local_path


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
    train_sources: list[DataSource] = option(
        [],
        "Training sources mixed by weight, repeatable: [NAME=]FILE, MODULE:FUNCTION, "
        "FILE.py:FUNCTION or an lmctl.sources entry point (readers' args: config file).",
        panel=PANEL_DATA,
        flags=("--train-source",),
    )
    validation_sources: list[DataSource] = option(
        [],
        "Evaluation sources, each scored alone too; as --train-source.",
        panel=PANEL_DATA,
        flags=("--validation-source",),
    )
    mix: list[float] = option(
        [], "Weights of the training sources, in their order: --mix 0.7,0.3.", panel=PANEL_DATA
    )
    mix_stopping_strategy: Literal["first_exhausted", "all_exhausted"] = option(
        "first_exhausted", "A mixture ends when one source, or all, run out.", panel=PANEL_DATA
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
        "it is uploaded (default: a folder per URL under $LMCTL_CACHE/runs, else "
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
    strict_resume: bool = option(
        False,
        "Refuse to continue (exit 2) when a training file changed since the run started, "
        "instead of warning.",
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
    restart_schedule: bool = option(
        False,
        "When resuming: a new learning-rate schedule (warmup included) over the steps left, "
        "from the step the run is at (default: the schedule of --max-steps goes on).",
        panel=PANEL_TRAINING,
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
    nnodes: int = option(
        1,
        "Machines taking part (with --nproc); MIN:MAX (torchrun's elastic form, with "
        "--max-restarts): a restart goes on with as few as MIN machines when others are lost, "
        "and grows again when they return.",
        panel=PANEL_SCALE,
        gt=0,
    )
    min_nnodes: int | None = option(
        None,
        "The fewest machines a restart goes on with (MIN of --nnodes MIN:MAX).",
        panel=PANEL_SCALE,
        cli=False,
        gt=0,
    )
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
        f"that stage ('auto' values filled from the flags). Needs {DISTRIBUTION}[deepspeed].",
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
    fit_check: bool = option(
        True,
        "Before building the model, estimate the memory per process (weights, gradients, "
        "optimizer state, activations) from the model's config and refuse a run that exceeds "
        "the device's free memory (LMCTL_FREE_MEMORY overrides the free memory); "
        "--no-fit-check trains anyway.",
        panel=PANEL_SCALE,
    )
    peft: Literal["lora"] | None = option(
        None,
        "Parameter-efficient fine-tuning: train a LoRA adapter instead of every weight. "
        f"Needs {DISTRIBUTION}[peft].",
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
    def _other_spellings(cls, data: Any) -> Any:
        """Upstream no_trainer's step options; ``--nnodes MIN:MAX``; ``--train-source``."""
        from lmctl.config.sources import flag_sources
        from lmctl.config.upstream import checkpointing_steps, machine_range

        return flag_sources(machine_range(checkpointing_steps(data)))

    @field_validator("training_args")
    @classmethod
    def _training_args_like_flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Each ``training_args`` value passes the rules of its flag (or, for a field lmctl
        does not model, its declared type), so that a bad value fails now, naming its key,
        not as an unexpected error once the Trainer or its data loader meets it."""
        from lmctl.config.upstream import check_training_args

        checked, problems = check_training_args(value, cls.model_fields)
        if problems:
            raise ConfigProblems(problems)
        return checked

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
        """The shared cross-field rules (:func:`lmctl.config.checks.check_document`);
        objectives extend this and call ``super().check``."""
        from lmctl.config.checks import check_document

        check_document(self, problems)

    def fast_path_names(self) -> frozenset[str] | None:
        """The paths a ``--fast-paths`` list names (None for auto and off)."""
        from lmctl.config.slices import ComputeSpec, take

        return take(ComputeSpec, self).fast_path_names()

    def resolved_output_dir(self) -> str:
        if self.output_dir is not None:
            return self.output_dir
        return os.path.join("runs", f"{self.objective}-{datetime.now():%Y%m%d-%H%M%S}")

    def mixed_precision(self, native_bf16: Callable[[], bool]) -> Literal["bf16", "fp16"] | None:
        """The autocast dtype to train in (see :meth:`ComputeSpec.mixed_precision`)."""
        from lmctl.config.slices import ComputeSpec, take

        return take(ComputeSpec, self).mixed_precision(native_bf16)

    def token_value(self) -> str | None:
        if self.token is not None:
            secrets.register(self.token.get_secret_value())
            return self.token.get_secret_value()
        return None
