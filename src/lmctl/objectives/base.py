"""What an objective is: the pieces that differ between clm, mlm, plm and swag.

An objective module defines a config class (light: pydantic only), the frozen options that
its methods receive (the fields that the config class adds to ``TrainConfig``) and an
:class:`Objective` (heavy libraries imported inside its methods). The shared pipeline
(``lmctl.pipeline``) and engines (``lmctl.engine``) call only the methods below, so a new
objective is one new file plus one line in ``lmctl.objectives.OBJECTIVES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Iterator

    from datasets import Dataset, DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.base import TrainConfig
    from lmctl.config.slices import Access, DataSpec, LoopSpec, ModelSpec
    from lmctl.config.values import FastPathName
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics
    from lmctl.metrics.lm_head import TiledHead

OptionsT = TypeVar("OptionsT")


class Objective(ABC, Generic[OptionsT]):
    name: ClassVar[str]
    #: One-line description shown in ``lmctl train --help``.
    summary: ClassVar[str]
    #: Hugging Face pipeline tag written into the model card.
    task_tag: ClassVar[str]
    config_class: ClassVar[type[TrainConfig]]
    #: The frozen options built from a config of ``config_class`` (its own fields).
    options_class: ClassVar[type]
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
    #: Whether the collator draws at random (masks, permutations).
    random_batches: ClassVar[bool] = False
    #: The fast training losses this objective can take (:mod:`lmctl.fastpaths.losses`), the
    #: preferred first; the first that is on and fits the model is installed.
    training_losses: ClassVar[tuple[FastPathName, ...]] = ()

    def embedded_default(self) -> dict[str, Any] | None:
        """Values that make ``lmctl train <name>`` run with no model and no data, if any."""
        return None

    def training_texts(
        self, options: OptionsT, data: DataSpec, train: Any, where: str
    ) -> Iterator[list[str]]:
        """Texts that ``--train-tokenizer`` learns from: of the loaded train split, or with
        ``--streaming`` of its source (:class:`lmctl.data.stream.sources.TextSource`)."""
        from lmctl.data.load import iterate_texts, text_column

        if data.streaming:
            return cast("Iterator[list[str]]", train.texts())
        return iterate_texts(train, text_column(train, data.text_column, where))

    def text_options(self, options: OptionsT) -> dict[str, Any]:
        """Options for reading .txt files (the ``datasets`` text builder)."""
        return {}

    def check_records(
        self, options: OptionsT, dataset: Dataset, where: str, path: str | None
    ) -> None:
        """Reject malformed records of a split as loaded (before the validation hold-out and
        sample limits, so that ``lmctl.data.load.record_location(path, index)`` names the line)."""
        return

    @abstractmethod
    def auto_model_class(self) -> Any:
        """The transformers Auto class that builds or loads the model."""

    def check_architecture(
        self, model: ModelSpec, access: Access, model_config: PretrainedConfig
    ) -> None:
        """Reject an architecture this objective can't train, before the tokenizer and data."""
        from lmctl.models.config import check_auto_class

        check_auto_class(model, access, self, model_config)

    def adapt_model_config(self, model_config: PretrainedConfig, console: Console) -> None:
        """Adjust the model config for this objective before the model is built (saying so)."""
        return

    def head_split(self, model: Any, inputs: dict[str, Any]) -> TiledHead | None:
        """How evaluation scores ``model`` from its last hidden states without the batch's
        full logits, checked on ``inputs`` (the first batch); None: one sample at a time."""
        return None

    def model_classes(self) -> set[str]:
        """Names of the model classes this objective trains (used to infer a model's task)."""
        from lmctl.models.config import model_class_names

        return model_class_names(self.auto_model_class())

    def check_model(
        self,
        options: OptionsT,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        source: str,
    ) -> None:
        """Reject a model or tokenizer this objective cannot train, before any data work;
        ``source`` is how the user named the tokenizer, for messages."""
        return

    @abstractmethod
    def preprocess(
        self,
        options: OptionsT,
        raw: DatasetDict,
        tokenizer: PreTrainedTokenizerBase,
        model_config: PretrainedConfig,
        console: Console,
        *,
        data: DataSpec,
        loop: LoopSpec,
    ) -> DatasetDict:
        """Turn raw records into model inputs (tokenize, group, label); ``loop`` only says
        what the data layer needs (evaluation, seed and workers of a stream)."""

    def groups_by_length(self, group_by_length: bool) -> bool:
        """Whether training batches group samples of similar length (``--group-by-length``,
        off unless asked for, as upstream)."""
        return group_by_length

    @abstractmethod
    def collator(
        self, options: OptionsT, tokenizer: PreTrainedTokenizerBase, pad_multiple: int | None
    ) -> Any:
        """Batch builder used for training and evaluation; ``pad_multiple`` is the length
        that mixed precision wants padded batches a multiple of (None in fp32)."""

    def eval_collator(
        self,
        options: OptionsT,
        tokenizer: PreTrainedTokenizerBase,
        pad_multiple: int | None,
        seed: int,
    ) -> Any:
        """Batch builder for evaluation: the collator, made deterministic with ``seed`` where
        it draws at random."""
        collator = self.collator(options, tokenizer, pad_multiple)
        if not self.random_batches:
            return collator
        from lmctl.objectives.collate import SeededCollator

        return SeededCollator(collator, seed)

    @abstractmethod
    def metrics(self) -> BatchMetrics:
        """Per-batch metric accumulator; evaluation never holds all logits."""

    def model_card_tags(self) -> list[str]:
        return [self.task_tag]
