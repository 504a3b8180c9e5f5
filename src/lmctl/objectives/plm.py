"""Permutation language modelling (``run_plm.py``): XLNet.

Texts are grouped into ``--max-seq-length`` blocks, or kept one sample per non-empty line
with ``--line-by-line``. The permutation collator needs an even sequence length: an odd
``--max-seq-length`` is rejected before any work, and dynamically padded batches are padded
to an even length (a multiple of 8 under mixed precision), so every batch is even by
construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmctl.config.base import Problems
from lmctl.config.fields import PANEL_OBJECTIVE, option
from lmctl.errors import ConfigError
from lmctl.models.config import model_source
from lmctl.objectives.base import Objective
from lmctl.objectives.collate import draw_one_target, masked_positions, pad_features
from lmctl.objectives.common import (
    LineByLineConfig,
    LineByLineOptions,
    resolve_sequence_length,
    tokenize_texts,
)

if TYPE_CHECKING:
    from datasets import DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.slices import Access, DataSpec, LoopSpec, ModelSpec
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics

XLNET_HINT = (
    "use an XLNet model, e.g. --model-type xlnet --config-overrides "
    "d_model=256,n_layer=4,n_head=4,d_inner=1024"
)


class PlmConfig(LineByLineConfig):
    objective: ClassVar[str] = "plm"

    max_seq_length: int = option(
        512,
        "Tokens per sequence, an even number (larger than the tokenizer's maximum: clamped "
        "with a warning). Longer inputs are truncated.",
        panel=PANEL_OBJECTIVE,
        gt=0,
    )
    plm_probability: float = option(
        1 / 6,
        "Ratio of the length of a span of masked tokens to the length of its surrounding context.",
        panel=PANEL_OBJECTIVE,
        gt=0,
        le=1,
    )
    max_span_length: int = option(
        5, "Maximum length of a span of masked tokens.", panel=PANEL_OBJECTIVE, gt=0
    )

    def check(self, problems: Problems) -> None:
        super().check(problems)
        if self.max_seq_length % 2:
            length = self.max_seq_length
            problems.add(
                f"--max-seq-length {length}: permutation language modelling needs an even "
                "sequence length",
                f"use --max-seq-length {length + 1}" + (f" or {length - 1}" if length > 1 else ""),
            )
        from_scratch = self.model_name_or_path is None and self.config_name is None
        # A custom architecture (--import) may be an XLNet subclass; that is checked later.
        if from_scratch and self.model_type not in (None, "xlnet") and not self.imports:
            problems.add(
                f"--model-type {self.model_type}: plm trains XLNet models only", XLNET_HINT
            )


@dataclass(frozen=True)
class PlmOptions(LineByLineOptions):
    plm_probability: float
    max_span_length: int


class PermutationCollator:
    """Pads a batch to an even length, then lets transformers draw the permutation masks.

    A batch in which no span was drawn over a real token (a few short lines) has no target and
    a NaN loss; such a batch gets one non-special token as its target, hidden from every
    position by the permutation mask, as a drawn target is.
    """

    def __init__(
        self, permuting: Any, tokenizer: PreTrainedTokenizerBase, multiple_of: int
    ) -> None:
        self.permuting = permuting
        self.tokenizer = tokenizer
        self.multiple_of = multiple_of

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        import torch

        padded = pad_features(features, self.tokenizer, self.multiple_of)
        batch = self.permuting(padded)
        target = draw_one_target(batch, self.tokenizer)
        if target is not None:
            row, column = target
            batch["perm_mask"][row, :, column] = 1
        if "attention_mask" in padded[0]:
            batch["attention_mask"] = torch.tensor(
                [feature["attention_mask"] for feature in padded], dtype=torch.long
            )
        return batch


class Plm(Objective[PlmOptions]):
    name = "plm"
    summary = "Permutation language modelling (XLNet)"
    # The Hub has no pipeline tag for permutation LM; XLNet's LM head generates text.
    task_tag = "text-generation"
    config_class = PlmConfig
    options_class = PlmOptions
    random_batches = True
    tokenizer_algorithm = "unigram"
    example_models = "xlnet"

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def model_classes(self) -> set[str]:
        return {"XLNetLMHeadModel"}

    def model_card_tags(self) -> list[str]:
        return [self.task_tag, "language-modeling", "permutation-language-modeling"]

    def check_architecture(
        self, model: ModelSpec, access: Access, model_config: PretrainedConfig
    ) -> None:
        from transformers import XLNetConfig

        if not isinstance(model_config, XLNetConfig):
            raise ConfigError(
                f"{model_source(model)}: a {model_config.model_type} model "
                "can't be trained for permutation language modelling, which is XLNet's objective",
                XLNET_HINT,
            )
        super().check_architecture(model, access, model_config)

    def check_model(
        self,
        options: PlmOptions,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        source: str,
    ) -> None:
        for token, role in (("mask_token", "mask"), ("pad_token", "padding")):
            if getattr(tokenizer, token) is None:
                raise ConfigError(
                    f"{source}: the tokenizer has no {role} token, which permutation language "
                    "modelling needs",
                    "use an XLNet tokenizer, or --train-tokenizer when training from scratch",
                )

    def preprocess(
        self,
        options: PlmOptions,
        raw: DatasetDict,
        tokenizer: PreTrainedTokenizerBase,
        model_config: PretrainedConfig,
        console: Console,
        *,
        data: DataSpec,
        loop: LoopSpec,
    ) -> DatasetDict:
        length = resolve_sequence_length(
            options.max_seq_length, "--max-seq-length", tokenizer, model_config, console
        )
        if length % 2:
            console.info(f"using {length - 1} tokens: permutation needs an even length")
            length -= 1
        console.info(f"max sequence length: {length} tokens")
        return tokenize_texts(
            options,
            raw,
            tokenizer,
            length,
            console,
            data=data,
            loop=loop,
            text_options=self.text_options(options),
        )

    def collator(
        self, options: PlmOptions, tokenizer: PreTrainedTokenizerBase, pad_multiple: int | None
    ) -> Any:
        from transformers import DataCollatorForPermutationLanguageModeling

        permuting = DataCollatorForPermutationLanguageModeling(
            tokenizer=tokenizer,
            plm_probability=options.plm_probability,
            max_span_length=options.max_span_length,
        )
        return PermutationCollator(permuting, tokenizer, pad_multiple or 2)

    def metrics(self) -> BatchMetrics:
        from lmctl.metrics import BatchMetrics

        return BatchMetrics(masked_positions)


OBJECTIVE = Plm()
