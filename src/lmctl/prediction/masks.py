"""Filled masks (mlm): for each mask token in a text, the model's most likely tokens there,
with their probabilities (a softmax over the whole vocabulary at that position)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from lmctl.prediction.inputs import Item
    from lmctl.prediction.load import Loaded


def mask_token(tokenizer: Any, where: str) -> str:
    """The tokenizer's mask token (``[MASK]``, ``<mask>``, ...)."""
    token = getattr(tokenizer, "mask_token", None)
    if not token or tokenizer.mask_token_id is None:
        raise ModelError(
            f"{where}: the tokenizer has no mask token, so there is nothing to fill in",
            "give a model trained with 'lmctl train mlm' (its tokenizer has one)",
        )
    return str(token)


def check_masks(items: list[Item], mask: str) -> None:
    """Every text holds the mask token; checked before the model loads."""
    for item in items:
        assert item.text is not None
        if mask not in item.text:
            flag = item.where if item.where.startswith("--prompt") else f"--input {item.where}"
            raise ConfigError(
                f"{flag}: no mask token {mask} in {_short(item.text)!r}",
                f"put {mask} where a word should be filled in, e.g. 'the cat sat on the {mask} .'",
            )


def fill_masks(loaded: Loaded, items: list[Item], top_k: int) -> list[dict[str, Any]]:
    """For each text: every mask's ``top_k`` candidates (most likely first), and the text with
    each mask replaced by its most likely token."""
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    mask = mask_token(tokenizer, "PATH")
    results = []
    for item in items:
        assert item.text is not None
        encoded = tokenizer(
            item.text,
            return_tensors="pt",
            truncation=loaded.max_length is not None,
            max_length=loaded.max_length,
        )
        ids = encoded["input_ids"][0]
        positions = (ids == tokenizer.mask_token_id).nonzero(as_tuple=True)[0].tolist()
        expected = item.text.count(mask)
        if len(positions) < expected:
            raise ConfigError(
                f"{item.where}: {expected - len(positions)} of its {expected} {mask} tokens "
                f"lie past the {loaded.max_length} tokens the model reads",
                "shorten the text, or move the masks nearer its start",
            )
        inputs = {key: value.to(loaded.device) for key, value in encoded.items()}
        with torch.inference_mode():
            logits = model(**inputs).logits[0]
        k = min(top_k, logits.shape[-1])
        masks = []
        best_tokens: list[str] = []
        for number, position in enumerate(positions, start=1):
            probabilities = torch.softmax(logits[position].float(), dim=-1)
            values, indices = probabilities.topk(k)
            candidates: list[dict[str, Any]] = [
                {
                    "token": _token_text(tokenizer, int(index)),
                    "token_id": int(index),
                    "probability": float(value),
                }
                for value, index in zip(values.tolist(), indices.tolist(), strict=True)
            ]
            best_tokens.append(candidates[0]["token"])
            masks.append({"mask": number, "position": position, "candidates": candidates})
        results.append(
            {
                "input": item.where,
                "text": item.text,
                "filled": _filled(item.text, mask, best_tokens),
                "masks": masks,
            }
        )
    return results


def _token_text(tokenizer: Any, token_id: int) -> str:
    """A token as the tokenizer decodes it alone (byte-level pieces as text); its raw piece
    when that decodes to nothing."""
    text = tokenizer.decode([token_id]).strip()
    if text:
        return str(text)
    return str(tokenizer.convert_ids_to_tokens(token_id))


def _filled(text: str, mask: str, tokens: list[str]) -> str:
    parts = text.split(mask)
    out = parts[0]
    for index, rest in enumerate(parts[1:]):
        out += (tokens[index] if index < len(tokens) else mask) + rest
    return out


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
