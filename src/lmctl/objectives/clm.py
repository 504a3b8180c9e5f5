"""Causal language modelling (``run_clm.py``): GPT-2, Llama and other decoder models.

Texts are tokenized, concatenated and cut into ``block_size`` blocks (the remainder is
dropped); labels are the inputs, shifted inside the model. Accuracy is next-token accuracy.

An encoder (BERT, RoBERTa, ELECTRA, ...) has a causal-LM class that attends both ways unless
its config sets ``is_decoder``: the model would see the tokens it predicts. lmctl sets
``is_decoder=True`` for such models, as transformers advises, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmctl.config.base import TrainConfig
from lmctl.config.fields import PANEL_OBJECTIVE, option
from lmctl.objectives.base import Objective
from lmctl.objectives.collate import BlockCollator
from lmctl.objectives.common import resolve_sequence_length, tokenize_and_group
from lmctl.resources import EMBEDDED_CORPUS

if TYPE_CHECKING:
    from datasets import DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.slices import DataSpec, LoopSpec
    from lmctl.console import Console
    from lmctl.metrics import BatchMetrics
    from lmctl.metrics.lm_head import TiledHead


class ClmConfig(TrainConfig):
    objective: ClassVar[str] = "clm"

    block_size: int | None = option(
        None,
        "Tokens per training block (default: the tokenizer's maximum, capped at 1024 and at "
        "the model's positions).",
        panel=PANEL_OBJECTIVE,
        gt=0,
    )
    keep_linebreaks: bool = option(
        True, "Keep line breaks when reading .txt files.", panel=PANEL_OBJECTIVE
    )


@dataclass(frozen=True)
class ClmOptions:
    block_size: int | None
    keep_linebreaks: bool


def _next_token(predictions: Any, labels: Any) -> tuple[Any, Any]:
    predictions = predictions[:, :-1]
    references = labels[:, 1:]
    scored = references != -100
    return predictions[scored], references[scored]


class Clm(Objective[ClmOptions]):
    name = "clm"
    shifts_labels = True
    # The loss from the output layer chunk by chunk, without the full-vocabulary logits: by
    # liger-kernel's fused kernels on a GPU, in tiles of PyTorch matmuls on a CPU.
    training_losses = ("fused-linear-loss", "tiled-loss")
    summary = "Causal language modelling (GPT-2, Llama, ...)"
    task_tag = "text-generation"
    config_class = ClmConfig
    options_class = ClmOptions
    tokenizer_algorithm = "bpe"
    example_models = "gpt2, llama, qwen2"
    # Blocks of token ids: a causal LM is trained on token ids alone.
    segment_ids = False

    def embedded_default(self) -> dict[str, Any]:
        return {
            "train_file": str(EMBEDDED_CORPUS),
            "model_type": "gpt2",
            "config_overrides": "n_layer=2,n_head=4,n_embd=128,n_positions=128",
            "train_tokenizer": 2000,
            "block_size": 128,
            "per_device_train_batch_size": 16,
            "learning_rate": 3e-3,
            "warmup_steps": 20,
            "num_train_epochs": 4,
            "validation_split_percentage": 5,
        }

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def adapt_model_config(self, model_config: PretrainedConfig, console: Console) -> None:
        if _is_bidirectional_encoder(model_config):
            model_config.is_decoder = True
            console.info(
                f"{model_config.model_type} is an encoder: using it as a causal LM with "
                "is_decoder=True, so that each token attends only to those before it (its "
                "pretrained weights, if any, were learnt attending both ways)"
            )

    def head_split(self, model: Any, inputs: dict[str, Any]) -> TiledHead | None:
        from lmctl.metrics.lm_head import TiledHead

        return TiledHead.of(model, inputs)

    def text_options(self, options: ClmOptions) -> dict[str, Any]:
        return {"keep_linebreaks": options.keep_linebreaks}

    def preprocess(
        self,
        options: ClmOptions,
        raw: DatasetDict,
        tokenizer: PreTrainedTokenizerBase,
        model_config: PretrainedConfig,
        console: Console,
        *,
        data: DataSpec,
        loop: LoopSpec,
    ) -> DatasetDict:
        block_size = resolve_sequence_length(
            options.block_size, "--block-size", tokenizer, model_config, console
        )
        console.info(f"block size: {block_size} tokens")
        return tokenize_and_group(
            raw,
            tokenizer,
            block_size,
            console,
            data=data,
            loop=loop,
            text_options=self.text_options(options),
        )

    def collator(self, options: ClmOptions, tokenizer: Any, pad_multiple: int | None) -> Any:
        return BlockCollator()

    def metrics(self) -> BatchMetrics:
        from lmctl.metrics import BatchMetrics

        return BatchMetrics(_next_token)


OBJECTIVE = Clm()


def _is_bidirectional_encoder(model_config: PretrainedConfig) -> bool:
    """Whether the architecture is an encoder (it has a masked-LM model) whose causal-LM class
    attends both ways unless the config sets ``is_decoder`` (BERT, RoBERTa, ELECTRA, ...)."""
    from transformers import AutoModelForMaskedLM

    mapping: Any = AutoModelForMaskedLM._model_mapping
    return (
        type(model_config) in mapping
        and not getattr(model_config, "is_encoder_decoder", False)
        and getattr(model_config, "is_decoder", None) is False
    )
