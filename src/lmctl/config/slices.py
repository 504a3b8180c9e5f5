"""The config cut into the parts that each layer reads (``docs/architecture.md`` lists who
receives which).

:class:`~lmctl.config.base.TrainConfig` is the one document: validated, saved as
``lmctl.yaml``, shown by ``lmctl config show`` and read back by ``lmctl resume``. Below the
entry points of training and evaluation no function takes it; each layer receives only the
slices it reads, typed and frozen, derived once by :func:`slice_config`. Every field of the
document belongs to exactly one slice or to :data:`DOCUMENT_ONLY` (``tests/test_layers.py``
checks it); a slice's fields carry the document's field names, so a flag, its field and the
slice that reads it are found by one search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lmctl import secrets

if TYPE_CHECKING:
    from pydantic import SecretStr

    from lmctl.config.sources import DataSource

Slice = TypeVar("Slice")

#: Fields that only the document keeps: spellings that the validators turn into others.
DOCUMENT_ONLY = ("checkpointing_steps", "mix")


def take(kind: type[Slice], document: Any) -> Slice:
    """The slice ``kind`` of ``document``: its fields of the same names."""
    return kind(**{item.name: getattr(document, item.name) for item in fields(kind)})  # type: ignore[arg-type]


def field_names(kind: type) -> tuple[str, ...]:
    return tuple(item.name for item in fields(kind))


@dataclass(frozen=True)
class Access:
    """How to reach the Hub and the stores that models and data come from."""

    token: SecretStr | None
    cache_dir: str | None
    trust_remote_code: bool

    def token_value(self) -> str | None:
        """The token, registered as a secret so that no log or file ever shows it."""
        if self.token is None:
            return None
        value = self.token.get_secret_value()
        secrets.register(value)
        return value


@dataclass(frozen=True)
class ModelSpec:
    """The model: pretrained, or built from scratch from an architecture."""

    model_name_or_path: str | None
    model_type: str | None
    config_overrides: str | None
    config_name: str | None
    model_revision: str
    dtype: str | None
    imports: list[str]
    gradient_checkpointing: bool

    @property
    def from_pretrained(self) -> bool:
        return self.model_name_or_path is not None

    @property
    def given(self) -> bool:
        """Whether any source of a model is named (``lmctl prepare`` needs none)."""
        return any(
            value is not None
            for value in (self.model_name_or_path, self.config_name, self.model_type)
        )


@dataclass(frozen=True)
class TokenizerSpec:
    tokenizer_name: str | None
    train_tokenizer: int | None
    use_fast_tokenizer: bool


@dataclass(frozen=True)
class DataSpec:
    """Where the data comes from, how much of it, and how it is read."""

    dataset_name: str | None
    dataset_config_name: str | None
    train_file: str | None
    validation_file: str | None
    text_column: str | None
    max_train_samples: int | None
    max_eval_samples: int | None
    validation_split_percentage: int
    preprocessing_num_workers: int | None
    overwrite_cache: bool
    prepared_cache_dir: str | None
    streaming: bool
    shuffle_buffer_size: int
    train_sources: list[DataSource]
    validation_sources: list[DataSource]
    mix_stopping_strategy: str

    def source(self, split: str) -> str:
        """How the user named the data of a split, for messages."""
        if split.startswith("validation_") and self.validation_sources:
            return f"validation source {split.removeprefix('validation_')}"
        named = self.train_sources if split == "train" else self.validation_sources
        if named:
            return f"{split}_sources ({', '.join(source.name for source in named)})"
        if split == "validation" and self.train_sources and self.validation_file is None:
            return "train_sources (held-out validation part)"
        path = self.train_file if split == "train" else self.validation_file
        if path is None and split == "validation" and self.train_file is not None:
            return f"{self.train_file} (held-out validation part)"
        if path is not None:
            return path
        return f"--dataset-name {self.dataset_name} [{split}]"


@dataclass(frozen=True)
class OptimizerSpec:
    learning_rate: float
    weight_decay: float
    lr_scheduler_type: str
    warmup_steps: int
    warmup_ratio: float | None
    #: On resuming: the schedule starts again at the checkpoint's step (see engine/optim.py).
    restart_schedule: bool
    max_grad_norm: float


@dataclass(frozen=True)
class LoopSpec:
    """What the engines loop over and when they log, evaluate and save."""

    engine: str
    do_train: bool
    do_eval: bool
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    num_train_epochs: float
    max_steps: int | None
    gradient_accumulation_steps: int
    seed: int
    group_by_length: bool
    dataloader_num_workers: int
    logging_steps: float
    eval_strategy: str
    eval_steps: float | None
    save_strategy: str
    save_steps: float
    save_total_limit: int | None
    #: Extra ``TrainingArguments`` fields (the accelerate engine honours a few of them).
    training_args: dict[str, Any]


@dataclass(frozen=True)
class ComputeSpec:
    """What the user asked of the arithmetic; resolved once into the run's runtime."""

    bf16: bool
    fp16: bool
    precision: str | None
    torch_compile: bool
    fast_paths: str

    @property
    def requested_precision(self) -> str:
        """``auto``, ``fp32``, ``bf16`` or ``fp16``, as the flags ask."""
        return self.precision or ("bf16" if self.bf16 else "fp16" if self.fp16 else "fp32")

    def mixed_precision(self, native_bf16: Callable[[], bool]) -> Literal["bf16", "fp16"] | None:
        """The autocast dtype to train in (None: fp32); ``native_bf16`` asks the hardware,
        and only for --precision auto."""
        requested = self.requested_precision
        if requested == "auto":
            return "bf16" if native_bf16() else None
        return None if requested == "fp32" else requested  # type: ignore[return-value]

    def fast_path_names(self) -> frozenset[str] | None:
        """The paths a ``--fast-paths`` list names (None for auto and off)."""
        if self.fast_paths in ("auto", "off"):
            return None
        return frozenset(self.fast_paths.split(","))


@dataclass(frozen=True)
class ScaleSpec:
    deepspeed: str | None
    fsdp: bool
    fsdp_sharding: str
    fsdp_auto_wrap: bool
    fsdp_cpu_offload: bool
    #: Whether ``lmctl train`` refuses a run whose memory estimate exceeds the free memory.
    fit_check: bool


@dataclass(frozen=True)
class AdapterSpec:
    peft: str | None
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: list[str]
    merge_adapter: bool


@dataclass(frozen=True)
class TrackingSpec:
    report_to: list[str]
    with_tracking: bool


@dataclass(frozen=True)
class RunDirSpec:
    """Where the run lives and what may happen to what is already there."""

    output_dir: str | None
    staging_dir: str | None
    overwrite_output_dir: bool
    resume_from_checkpoint: str | None
    strict_resume: bool


@dataclass(frozen=True)
class LaunchSpec:
    nproc: int | None
    nnodes: int
    #: With restarts: the fewest machines a restart goes on with (None: every machine).
    min_nnodes: int | None
    node_rank: int
    master_addr: str | None
    master_port: int | None
    launcher: str
    max_restarts: int


@dataclass(frozen=True)
class PublishSpec:
    push_to: str | None
    push_private: bool


#: The shared slices, by the attribute of :class:`RunSpec` that holds each.
SHARED_SLICES: dict[str, type] = {
    "access": Access,
    "model": ModelSpec,
    "tokenizer": TokenizerSpec,
    "data": DataSpec,
    "optimizer": OptimizerSpec,
    "loop": LoopSpec,
    "compute": ComputeSpec,
    "scale": ScaleSpec,
    "adapter": AdapterSpec,
    "tracking": TrackingSpec,
    "run_dir": RunDirSpec,
    "launch": LaunchSpec,
    "publish": PublishSpec,
}


@dataclass(frozen=True)
class RunSpec:
    """Every slice of one run's document, for the entry points that hand them out."""

    objective: str
    access: Access
    model: ModelSpec
    tokenizer: TokenizerSpec
    data: DataSpec
    optimizer: OptimizerSpec
    loop: LoopSpec
    compute: ComputeSpec
    scale: ScaleSpec
    adapter: AdapterSpec
    tracking: TrackingSpec
    run_dir: RunDirSpec
    launch: LaunchSpec
    publish: PublishSpec
    #: The objective's own options (``ClmOptions``, ``MlmOptions``, ...).
    options: Any

    def public_values(self) -> dict[str, Any]:
        """Every field of the document as this run sees it, but the secrets (the token)."""
        values: dict[str, Any] = {}
        for name in [*SHARED_SLICES, "options"]:
            values.update(vars(getattr(self, name)))
        values.pop("token", None)
        return values


def slice_config(document: Any, options: type) -> RunSpec:
    """Cut a validated ``TrainConfig`` into its slices; ``options`` is the objective's options
    type. (The document's module imports this one, so it is not named in the signature.)"""
    parts: dict[str, Any] = {name: take(kind, document) for name, kind in SHARED_SLICES.items()}
    return RunSpec(objective=document.objective, options=take(options, document), **parts)
