"""Continuations (clm and plm): ``model.generate`` from each prompt, greedy by default.

XLNet (plm) generates like a causal model: its ``generate`` appends a masked position after
the prompt and predicts it with every earlier token visible, one token at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError

if TYPE_CHECKING:
    from lmctl.console import Console
    from lmctl.prediction.inputs import Item
    from lmctl.prediction.load import Loaded


@dataclass(frozen=True)
class Generation:
    """How continuations are drawn (the flags of the same names)."""

    max_new_tokens: int = 40
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 42

    def shown(self) -> dict[str, Any]:
        values = asdict(self)
        if not self.do_sample:  # greedy decoding reads neither
            values.pop("temperature")
            values.pop("top_p")
        return values


def continuations(
    loaded: Loaded, items: list[Item], generation: Generation, console: Console
) -> list[dict[str, Any]]:
    """One continuation per prompt; each prompt's draws depend on the seed alone, not on the
    prompts before it."""
    import torch
    from transformers import set_seed

    model, tokenizer = loaded.model, loaded.tokenizer
    room = _prompt_room(loaded.max_length, generation.max_new_tokens)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    kwargs: dict[str, Any] = {
        "max_new_tokens": generation.max_new_tokens,
        "do_sample": generation.do_sample,
        "pad_token_id": pad,
    }
    if generation.do_sample:
        kwargs.update(temperature=generation.temperature, top_p=generation.top_p, top_k=0)
    else:  # greedy: no sampling settings, whatever the model's generation config says
        kwargs.update(temperature=None, top_p=None, top_k=None)
    results = []
    for item in items:
        assert item.text is not None
        ids = _prompt_ids(tokenizer, item.text)
        if not ids:
            raise ConfigError(
                f"{item.where}: no tokens in {item.text!r}", "give a prompt with some text"
            )
        if room is not None and len(ids) > room:
            console.warn(
                f"{item.where}: {len(ids)} tokens, longer than the {room} that fit before "
                f"--max-new-tokens {generation.max_new_tokens} in the model's "
                f"{loaded.max_length} positions: its first {len(ids) - room} tokens are left out"
            )
            ids = ids[-room:]
        input_ids = torch.tensor([ids], device=loaded.device)
        set_seed(generation.seed)
        with torch.inference_mode():
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        new = output[0, input_ids.shape[1] :].tolist()
        results.append(
            {
                "input": item.where,
                "prompt": item.text,
                "continuation": tokenizer.decode(new, skip_special_tokens=True),
                "new_tokens": len(new),
            }
        )
    return results


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The prompt's tokens as training saw text begin: with the tokens the tokenizer puts
    first (a BOS or [CLS]), without those it puts last (an EOS or [SEP] would end the text)."""
    ids = list(tokenizer(text)["input_ids"])
    special = set(tokenizer.all_special_ids)
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    while ids and ids[-1] in special and len(ids) > len(plain):
        ids.pop()
    return ids if any(token not in special for token in ids) else []


def _prompt_room(max_length: int | None, max_new_tokens: int) -> int | None:
    """The most prompt tokens that leave room for the new ones in the model's positions."""
    if max_length is None:
        return None
    if max_new_tokens >= max_length:
        raise ConfigError(
            f"--max-new-tokens {max_new_tokens}: the model reads at most {max_length} tokens, "
            "prompt included",
            f"give --max-new-tokens {max(1, max_length // 2)} or fewer",
        )
    return max_length - max_new_tokens
