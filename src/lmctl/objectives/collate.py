"""Batch builders that several objectives share: padding, deterministic masks for
evaluation (and for resumable training), and the selector that scores masked positions."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from lmctl.data.stream.positions import POSITION_COLUMN, strip_positions
from lmctl.errors import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class BlockCollator:
    """Stacks equal-length blocks; labels are the inputs (the model shifts them)."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        input_ids = torch.tensor([feature["input_ids"] for feature in features], dtype=torch.long)
        return {"input_ids": input_ids, "labels": input_ids.clone()}


def _pad_values(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    return {
        "input_ids": tokenizer.pad_token_id,
        "attention_mask": 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
        "special_tokens_mask": 1,
        "offset_mapping": [0, 0],
        "labels": -100,
    }


def pad_features(
    features: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, multiple_of: int = 1
) -> list[dict[str, Any]]:
    """Pad every per-token field of a batch to one length, a multiple of ``multiple_of``.

    Unlike ``tokenizer.pad`` this also pads nested per-token fields (offset mappings) and
    fields that the tokenizer does not know, so any collator can run on the result.
    """
    longest = max(len(feature["input_ids"]) for feature in features)
    length = -(-longest // multiple_of) * multiple_of
    values = _pad_values(tokenizer)
    left = tokenizer.padding_side == "left"
    padded = []
    for feature in features:
        missing = length - len(feature["input_ids"])
        if missing == 0:
            padded.append(feature)
            continue
        if values["input_ids"] is None:
            raise DataError(
                "the tokenizer has no padding token, so samples of different lengths can't "
                "be batched",
                "use a tokenizer with a pad token, or samples of equal length (no --line-by-line)",
            )
        out = dict(feature)
        for key, fill in values.items():
            if key in feature:
                pad = [fill] * missing
                out[key] = pad + list(feature[key]) if left else list(feature[key]) + pad
        if "attention_mask" not in feature:
            ones = [1] * len(feature["input_ids"])
            out["attention_mask"] = [0] * missing + ones if left else ones + [0] * missing
        padded.append(out)
    return padded


class SeededCollator:
    """Makes a random collator (masking, permutations) deterministic, without touching the
    global RNG.

    Each batch's random draws come from a generator seeded with ``seed``, ``epoch`` and the
    batch's token ids. Evaluation (epoch 0) gives the same numbers for the same model and
    data in every process or dataloader worker, however many evaluations ran before. Training
    (the accelerate engine sets ``epoch``) draws new masks every epoch, yet the same ones in a
    resumed run as in an uninterrupted one, whatever the dataloader prefetched.
    """

    def __init__(self, collator: Any, seed: int) -> None:
        self.collator = collator
        self.seed = seed
        self.epoch = 0

    def _batch_seed(self, features: list[dict[str, Any]]) -> int:
        digest = hashlib.blake2b(str(self.seed).encode(), digest_size=8)
        if self.epoch:
            digest.update(f":{self.epoch}".encode())
        for feature in features:
            ids = feature["input_ids"] if isinstance(feature, dict) else feature
            digest.update(_token_bytes(ids))
            digest.update(b"|")
        return int.from_bytes(digest.digest(), "little") & (2**63 - 1)

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        import torch

        features, mark, placeholders = strip_positions(features)
        if placeholders:
            # Batches a resumed stream yields in place of those trained on before: skipped
            # by the engine, never collated.
            return {POSITION_COLUMN: torch.tensor([[-1, len(features)]])}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._batch_seed(features))
            batch = self.collator(features)
        if mark is not None:
            batch[POSITION_COLUMN] = torch.tensor([mark], dtype=torch.int64)
        return batch


def _token_bytes(ids: Any) -> bytes:
    import numpy as np

    try:
        return np.asarray(ids, dtype=np.int64).tobytes()
    except (TypeError, ValueError):  # ragged, e.g. the choices of a multiple-choice record
        return repr(ids).encode()


def draw_one_target(
    batch: dict[str, Any], tokenizer: PreTrainedTokenizerBase
) -> tuple[int, int] | None:
    """The position that a batch whose random draw chose no target must predict, or ``None``
    when it has a target already (or no token that could be one).

    Without a target a batch's loss is a mean over nothing: NaN, which would poison the
    weights. The position is drawn among the batch's non-special tokens, from the same global
    generator as the collator's draws, so a seeded run stays reproducible. Its label is set;
    hiding the token from the model is the caller's part (a mask token, a permutation mask).
    """
    import torch

    labels, ids = batch["labels"], batch["input_ids"]
    if bool((labels != -100).any()):
        return None
    special = torch.tensor(tokenizer.all_special_ids, dtype=ids.dtype)
    candidates = (~torch.isin(ids, special)).nonzero()
    if not len(candidates):
        return None
    row, column = candidates[int(torch.randint(len(candidates), (1,)))].tolist()
    labels[row, column] = ids[row, column]
    return row, column


def masked_positions(predictions: Any, labels: Any) -> tuple[Any, Any]:
    """Predictions and labels at the positions that carry a label (not -100)."""
    scored = labels != -100
    return predictions[scored], labels[scored]
