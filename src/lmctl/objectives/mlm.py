"""Masked language modelling (``run_mlm.py``): BERT, RoBERTa, DistilBERT, ALBERT, ...

Texts are grouped into ``--max-seq-length`` blocks, or kept one sample per non-empty line
with ``--line-by-line``. Masks are drawn by the collator for every batch, so every epoch
sees new masks (dynamic masking); evaluation masks are drawn from a fixed seed so that two
evaluations of one model agree. Accuracy is scored on the masked positions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmctl.config.base import Problems
from lmctl.config.fields import PANEL_OBJECTIVE, option
from lmctl.errors import ConfigError
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

    from lmctl.config.slices import DataSpec, LoopSpec
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics
    from lmctl.metrics.lm_head import TiledHead


class MlmConfig(LineByLineConfig):
    objective: ClassVar[str] = "mlm"

    mlm_probability: float = option(
        0.15, "Fraction of tokens masked for prediction.", panel=PANEL_OBJECTIVE, gt=0, lt=1
    )
    whole_word_mask: bool = option(
        False,
        "Mask whole words (every sub-token of a chosen word, all replaced by the mask "
        "token) instead of single tokens. Needs a fast tokenizer.",
        panel=PANEL_OBJECTIVE,
    )

    def check(self, problems: Problems) -> None:
        super().check(problems)
        if self.whole_word_mask and not self.use_fast_tokenizer:
            problems.add(
                "--whole-word-mask needs a fast tokenizer (it reads word offsets)",
                "drop --no-use-fast-tokenizer",
            )
        if self.whole_word_mask and self.streaming:
            problems.add(
                "--whole-word-mask does not work with --streaming",
                "drop one of them; whole-word masking reads word offsets from prepared data",
            )


@dataclass(frozen=True)
class MlmOptions(LineByLineOptions):
    mlm_probability: float
    whole_word_mask: bool


class PaddedMaskingCollator:
    """Pads a batch (offset mappings included), then lets transformers draw the masks.

    Tokens that may be drawn are those that are not any of the tokenizer's special tokens,
    ``[UNK]`` included: what upstream's ``run_mlm.py`` draws from (its Trainer drops the
    tokenizer's per-sample mask of added special tokens, so the collator marks every special
    id). A mask that let ``[UNK]`` be drawn trained and scored the model on predicting
    ``[UNK]``: on text that a small vocabulary leaves full of it, an eval loss 13% below
    upstream's for the same weights. The mask is taken from the ids, vectorized.

    A batch in which no token was drawn (a few short lines) has no target, and its loss is a
    mean over nothing: NaN, which would poison the weights. Such a batch gets one token, drawn
    among its non-special ones, replaced by the mask token.
    """

    def __init__(self, masking: Any, tokenizer: PreTrainedTokenizerBase, multiple_of: int) -> None:
        self.masking = masking
        self.tokenizer = tokenizer
        self.multiple_of = multiple_of
        self.special_ids = sorted(set(tokenizer.all_special_ids))

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        import numpy as np

        padded = pad_features(features, self.tokenizer, self.multiple_of)
        ids = np.asarray([feature["input_ids"] for feature in padded], dtype=np.int64)
        special = np.isin(ids, self.special_ids).astype(np.int64)
        padded = [
            {**feature, "special_tokens_mask": row}
            for feature, row in zip(padded, special.tolist(), strict=True)
        ]
        batch = self.masking(padded)
        target = draw_one_target(batch, self.tokenizer)
        if target is not None:
            batch["input_ids"][target] = self.tokenizer.mask_token_id
        return batch


class Mlm(Objective[MlmOptions]):
    name = "mlm"
    summary = "Masked language modelling (BERT, RoBERTa, DistilBERT, ALBERT, ...)"
    task_tag = "fill-mask"
    config_class = MlmConfig
    options_class = MlmOptions
    random_batches = True
    tokenizer_algorithm = "wordpiece"
    example_models = "bert, roberta, distilbert, albert"
    # The prediction head on the masked positions only.
    training_losses = ("masked-head",)

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForMaskedLM

        return AutoModelForMaskedLM

    def check_model(
        self,
        options: MlmOptions,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        source: str,
    ) -> None:
        if tokenizer.mask_token is None:
            raise ConfigError(
                f"{source}: the tokenizer has no mask token, which masked language modelling needs",
                "use a BERT- or RoBERTa-style tokenizer, or --train-tokenizer when training "
                "from scratch",
            )
        if options.line_by_line and tokenizer.pad_token is None:
            raise ConfigError(
                f"{source}: the tokenizer has no padding token, which --line-by-line needs",
                "use a tokenizer with a pad token, or drop --line-by-line",
            )
        if options.whole_word_mask and not tokenizer.is_fast:
            raise ConfigError(
                f"{source}: --whole-word-mask needs a fast tokenizer (word offsets)",
                "use a tokenizer with a tokenizer.json, or drop --whole-word-mask",
            )

    def head_split(self, model: Any, inputs: dict[str, Any]) -> TiledHead | None:
        from lmctl.metrics.lm_head import TiledHead, prediction_head

        head = prediction_head(model)
        return None if head is None else TiledHead.of(model, inputs, head, shifted=False)

    def preprocess(
        self,
        options: MlmOptions,
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
        console.info(f"max sequence length: {length} tokens")
        # The special-tokens mask is computed once here instead of for every batch.
        return tokenize_texts(
            options,
            raw,
            tokenizer,
            length,
            console,
            data=data,
            loop=loop,
            text_options=self.text_options(options),
            special_tokens_mask=True,
            offsets=options.whole_word_mask,
        )

    def collator(
        self, options: MlmOptions, tokenizer: PreTrainedTokenizerBase, pad_multiple: int | None
    ) -> Any:
        from transformers import DataCollatorForLanguageModeling

        # Whole words are always replaced by the mask token (transformers forces it anyway,
        # with a warning); single tokens keep the usual 80% mask / 10% random / 10% kept.
        whole = options.whole_word_mask
        masking = DataCollatorForLanguageModeling(
            tokenizer=tokenizer,
            mlm_probability=options.mlm_probability,
            whole_word_mask=whole,
            mask_replace_prob=1.0 if whole else 0.8,
            random_replace_prob=0.0 if whole else 0.1,
        )
        dynamic = options.line_by_line and not options.pad_to_max_length
        return PaddedMaskingCollator(masking, tokenizer, (pad_multiple if dynamic else None) or 1)

    def metrics(self) -> BatchMetrics:
        from lmctl.metrics import BatchMetrics

        return BatchMetrics(masked_positions)


OBJECTIVE = Mlm()
