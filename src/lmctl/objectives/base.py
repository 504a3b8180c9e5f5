"""What an objective is: the pieces that differ between clm, mlm, plm and swag.

An objective module defines a config class (light: pydantic only) and an :class:`Objective`
(heavy libraries imported inside its methods). The shared pipeline (``lmctl.pipeline``) and
engines (``lmctl.engine``) call only the methods below, so a new objective is one new file
plus one line in ``lmctl.objectives.OBJECTIVES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

if TYPE_CHECKING:
    from collections.abc import Iterator

    from datasets import Dataset, DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.base import FastPathName, TrainConfig
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics
    from lmctl.metrics.lm_head import TiledHead


class Objective(ABC):
    name: ClassVar[str]
    #: One-line description shown in ``lmctl train --help``.
    summary: ClassVar[str]
    #: Hugging Face pipeline tag written into the model card.
    task_tag: ClassVar[str]
    config_class: ClassVar[type[TrainConfig]]
    #: Algorithm used by ``--train-tokenizer``.
    tokenizer_algorithm: ClassVar[Literal["bpe", "wordpiece", "unigram"]] = "bpe"
    #: Whether the model scores labels shifted by one position (causal LMs).
    shifts_labels: ClassVar[bool] = False
    #: Whether perplexity = exp(eval_loss) is meaningful for this objective.
    reports_perplexity: ClassVar[bool] = True
    #: Architectures to suggest when a model can't be trained for this objective.
    example_models: ClassVar[str] = ""
    #: Whether a stream of this objective reads whole records (several columns) rather than
    #: one text column.
    streams_records: ClassVar[bool] = False
    #: Whether the model is given the tokenizer's segment ids (``token_type_ids``).
    segment_ids: ClassVar[bool] = True
    #: The fast training losses this objective can take (:mod:`lmctl.fastpaths.losses`), the
    #: preferred first; the first that is on and fits the model is installed.
    training_losses: ClassVar[tuple[FastPathName, ...]] = ()

    def embedded_default(self) -> dict[str, Any] | None:
        """Values that make ``lmctl train <name>`` run with no model and no data, if any."""
        return None

    def training_texts(self, config: TrainConfig, train: Any, where: str) -> Iterator[list[str]]:
        """Texts that ``--train-tokenizer`` learns from: of the loaded train split, or with
        ``--streaming`` of its source (:class:`lmctl.data.stream.TextSource`)."""
        from lmctl.data.load import iterate_texts, text_column

        if config.streaming:
            return cast("Iterator[list[str]]", train.texts())
        return iterate_texts(train, text_column(train, config.text_column, where))

    def text_options(self, config: TrainConfig) -> dict[str, Any]:
        """Options for reading .txt files (the ``datasets`` text builder)."""
        return {}

    def check_records(
        self, config: TrainConfig, dataset: Dataset, where: str, path: str | None
    ) -> None:
        """Reject malformed records of a split as loaded (before the validation hold-out and
        sample limits, so that ``lmctl.data.load.record_location(path, index)`` names the line)."""
        return

    @abstractmethod
    def auto_model_class(self) -> Any:
        """The transformers Auto class that builds or loads the model."""

    def check_architecture(self, config: TrainConfig, model_config: PretrainedConfig) -> None:
        """Reject an architecture this objective can't train, before the tokenizer and data."""
        from lmctl.models.build import check_auto_class

        check_auto_class(config, self, model_config)

    def adapt_model_config(
        self, config: TrainConfig, model_config: PretrainedConfig, console: Console
    ) -> None:
        """Adjust the model config for this objective before the model is built (saying so)."""
        return

    def head_split(self, model: Any, inputs: dict[str, Any]) -> TiledHead | None:
        """How evaluation scores ``model`` from its last hidden states without the batch's
        full logits, checked on ``inputs`` (the first batch); None: one sample at a time."""
        return None

    def model_classes(self) -> set[str]:
        """Names of the model classes this objective trains (used to infer a model's task)."""
        from lmctl.models.build import model_class_names

        return model_class_names(self.auto_model_class())

    def check_model(
        self,
        config: TrainConfig,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        """Reject a model or tokenizer this objective cannot train, before any data work."""
        return

    @abstractmethod
    def preprocess(
        self,
        config: TrainConfig,
        raw: DatasetDict,
        tokenizer: PreTrainedTokenizerBase,
        model_config: PretrainedConfig,
        console: Console,
    ) -> DatasetDict:
        """Turn raw records into model inputs (tokenize, group, label)."""

    def groups_by_length(self, config: TrainConfig) -> bool:
        """Whether training batches group samples of similar length (``--group-by-length``,
        off unless asked for, as upstream)."""
        return bool(config.group_by_length)

    @abstractmethod
    def collator(self, config: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> Any:
        """Batch builder used for training and evaluation."""

    def eval_collator(self, config: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> Any:
        """Batch builder for evaluation; objectives with random masking make it deterministic."""
        return self.collator(config, tokenizer)

    @abstractmethod
    def metrics(self) -> BatchMetrics:
        """Per-batch metric accumulator; evaluation never holds all logits."""

    def model_card_tags(self) -> list[str]:
        return [self.task_tag]
