"""The run's tokenizer: a pretrained one, or one trained on the training data for a model
built from scratch (``--train-tokenizer VOCAB_SIZE``, beyond upstream), kept to be reused by
the next run on the same texts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from lmctl import distributed
from lmctl.errors import ConfigError, ModelError
from lmctl.models.config import max_positions
from lmctl.models.pretrained import hub_kwargs, load_pretrained
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.slices import Access, ModelSpec, TokenizerSpec
    from lmctl.console import Console
    from lmctl.models.config import ModelObjective

#: The roles of the special tokens of WordPiece (BERT's) and Unigram (XLNet's) tokenizers.
_ROLES = ("unk", "sep", "pad", "cls", "mask")
SPECIAL_TOKENS = {
    "bpe": dict.fromkeys(("bos_token", "eos_token", "unk_token"), "<|endoftext|>"),
    "wordpiece": {f"{role}_token": f"[{role.upper()}]" for role in _ROLES},
    "unigram": {"bos_token": "<s>", "eos_token": "</s>"}
    | {f"{role}_token": f"<{role}>" for role in _ROLES},
}


#: Files a tokenizer can be read from: what ``save_pretrained`` writes (tokenizer_config.json,
#: tokenizer.json) and the vocabularies of the slow tokenizers (vocab.txt, vocab.json and
#: merges.txt, sentencepiece models), by pattern, so that any name that may be one counts.
TOKENIZER_FILE_PATTERNS = ("tokenizer*", "*vocab*", "merges.txt", "*.model", "*spm*", "*.codes")


def check_tokenizer_files(tokenizer_spec: TokenizerSpec, model_spec: ModelSpec) -> None:
    """Refuse a local model directory that holds no tokenizer when no other tokenizer is
    named. ``AutoTokenizer`` would quietly build one from the model's type with a vocabulary
    of its special tokens alone: every word becomes unknown, the data is prepared, and the
    run fails much later with a non-finite loss. A Hub model keeps its own checks."""
    name = model_spec.model_name_or_path
    if tokenizer_spec.tokenizer_name or tokenizer_spec.train_tokenizer or name is None:
        return
    path = local_path(name)
    if is_remote(name) or not path.is_dir():
        return
    if any(next(path.glob(pattern), None) for pattern in TOKENIZER_FILE_PATTERNS):
        return
    raise ModelError(
        f"{name} has no tokenizer files: give --tokenizer-name",
        f"give --tokenizer-name with the tokenizer {name} was trained with (a directory or "
        "a Hub id), or save that tokenizer into the model directory",
    )


def tokenizer_source(tokenizer_spec: TokenizerSpec, model_spec: ModelSpec) -> str:
    """The flag and value that chose the tokenizer, for messages."""
    if tokenizer_spec.train_tokenizer is not None:
        return f"--train-tokenizer {tokenizer_spec.train_tokenizer}"
    if tokenizer_spec.tokenizer_name is not None:
        return f"--tokenizer-name {tokenizer_spec.tokenizer_name}"
    return f"--model-name-or-path {model_spec.model_name_or_path}"


def load_tokenizer(
    objective: ModelObjective,
    model_config: PretrainedConfig,
    training_texts: Callable[[], Iterator[list[str]]],
    console: Console,
    *,
    tokenizer_spec: TokenizerSpec,
    model_spec: ModelSpec,
    access: Access,
    world_size: int,
    overwrite_cache: bool,
    resume_from: Path | None = None,
    cache_dir: Path | None = None,
) -> PreTrainedTokenizerBase:
    """The run's tokenizer; with ``--train-tokenizer``, the one trained for this run when
    ``resume_from`` (the checkpoint the run resumes from) holds it, else one trained on the
    same texts before when ``cache_dir`` keeps it and not ``overwrite_cache`` (see
    :func:`train_tokenizer`)."""
    from transformers import AutoTokenizer

    use_fast = tokenizer_spec.use_fast_tokenizer
    if tokenizer_spec.train_tokenizer is not None:
        if resume_from is not None and (resume_from / "tokenizer_config.json").is_file():
            console.info(f"resuming: using the tokenizer trained for this run ({resume_from})")
            return load_pretrained(
                AutoTokenizer.from_pretrained,
                str(resume_from),
                "--resume-from-checkpoint",
                use_fast=use_fast,
            )
        return train_tokenizer(
            training_texts,
            vocab_size=tokenizer_spec.train_tokenizer,
            algorithm=objective.tokenizer_algorithm,
            model_max_length=max_positions(model_config) or 1024,
            console=console,
            world_size=world_size,
            cache_dir=cache_dir,
            reuse=not overwrite_cache,
        )
    name = tokenizer_spec.tokenizer_name or model_spec.model_name_or_path
    assert name is not None
    flag = "--tokenizer-name" if tokenizer_spec.tokenizer_name else "--model-name-or-path"
    return load_pretrained(
        AutoTokenizer.from_pretrained,
        name,
        flag,
        use_fast=use_fast,
        **hub_kwargs(access, model_spec.model_revision),
    )


def leave_out_segment_ids(tokenizer: PreTrainedTokenizerBase, console: Console) -> None:
    """Make ``tokenizer`` (and the copy a run saves) return no ``token_type_ids``, for a model
    trained without them: ``model(**tokenizer(text))`` then gives the model what it learnt
    from (GPT-2 accepts segment ids and looks them up in its token embedding)."""
    names = [name for name in tokenizer.model_input_names if name != "token_type_ids"]
    if names == list(tokenizer.model_input_names):
        return
    tokenizer.model_input_names = names
    tokenizer.init_kwargs["model_input_names"] = names
    console.info(
        "the tokenizer returns token_type_ids, which this objective does not give the model: "
        "the run's tokenizer leaves them out"
    )


def train_tokenizer(
    training_texts: Callable[[], Iterator[list[str]]],
    *,
    vocab_size: int,
    algorithm: str,
    model_max_length: int,
    console: Console,
    world_size: int,
    cache_dir: Path | None = None,
    reuse: bool = True,
) -> PreTrainedTokenizerBase:
    """Train a tokenizer on the training data with the ``tokenizers`` library.

    Its WordPiece and Unigram trainers break ties between equally frequent candidates in
    hash order, so two trainings on the same text give slightly different vocabularies. So
    in a launch of ``world_size`` processes the main process trains the tokenizer and the
    others receive it (each training its own would map the same text to other ids on each);
    and with ``cache_dir``, a tokenizer is kept there under a hash of the texts it learnt
    from, and reused by the next run on the same texts (the same command trains the same
    model again, and data ``lmctl prepare`` tokenized with it stays valid); ``reuse=False``
    trains a new one in its place."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if world_size > 1 and algorithm != "bpe" and not distributed.launcher_store():
        raise ConfigError(
            f"--train-tokenizer: this launch of {world_size} processes has no "
            f"torchrun store to share one tokenizer through, and two {algorithm} trainings "
            "on the same text differ",
            "launch with torchrun, accelerate launch or --nproc; or give --tokenizer-name DIR "
            "with a tokenizer trained beforehand: a one-process run saves its tokenizer in its "
            "output directory",
        )
    trained = distributed.from_main_process(
        "tokenizer",
        partial(
            _kept_or_trained,
            training_texts,
            vocab_size,
            algorithm,
            cache_dir=cache_dir,
            reuse=reuse,
            console=console,
        ),
    )
    tokenizer = Tokenizer.from_str(trained)
    specials = SPECIAL_TOKENS[algorithm]
    extra: dict[str, Any] = {}
    if algorithm == "wordpiece":
        # BERT-style models take segment ids for sentence pairs (multiple choice).
        extra["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, **specials, **extra
    )


def _kept_or_trained(
    training_texts: Callable[[], Iterator[list[str]]],
    vocab_size: int,
    algorithm: str,
    *,
    cache_dir: Path | None,
    reuse: bool,
    console: Console,
) -> str:
    """The JSON of the tokenizer ``cache_dir`` keeps for these texts and settings (when
    ``reuse``), else of one trained now and kept there."""
    import hashlib

    import tokenizers

    from lmctl import __version__
    from lmctl.storage.atomic import atomic_write

    kept = None
    if cache_dir is not None:
        digest = hashlib.sha256(f"{__version__} {tokenizers.__version__}".encode())
        for batch in training_texts():
            for piece in batch:
                digest.update(piece.encode())
                digest.update(b"\0")
        name = f"{algorithm}-{vocab_size}-{digest.hexdigest()[:24]}.json"
        kept = cache_dir / "tokenizers" / name
        found = _kept_tokenizer(kept, console) if reuse else None
        if found is not None:
            console.info(f"using the {algorithm} tokenizer trained on these texts before: {kept}")
            return found
    tokenizer = _trained_tokenizer(training_texts, vocab_size, algorithm)
    trained = str(tokenizer.to_str())
    console.info(
        f"trained a {algorithm} tokenizer on the training data: "
        f"{tokenizer.get_vocab_size()} tokens (asked for {vocab_size})"
        + (f"; kept in {kept}" if kept is not None else "")
    )
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(kept, trained)
        except OSError as exc:
            console.warn(f"could not keep the tokenizer in {kept} ({exc.strerror or exc})")
    return trained


def _kept_tokenizer(kept: Path, console: Console) -> str | None:
    """The tokenizer JSON kept in ``kept``; None when there is none or it does not load."""
    from tokenizers import Tokenizer

    if not kept.is_file():
        return None
    text = kept.read_text(encoding="utf-8", errors="replace")
    try:
        Tokenizer.from_str(text)
    except Exception:  # tokenizers raises a bare Exception for a file it can't read
        console.warn(f"{kept} is not a tokenizer file: training a new one in its place")
        return None
    return text


def _trained_tokenizer(
    training_texts: Callable[[], Iterator[list[str]]], vocab_size: int, algorithm: str
) -> Any:
    """A ``tokenizers`` tokenizer trained on the texts."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers as tk_trainers

    specials = SPECIAL_TOKENS[algorithm]
    special_list = list(dict.fromkeys(specials.values()))
    tokenizer: Any
    if algorithm == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer: Any = tk_trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special_list,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif algorithm == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=specials["unk_token"]))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = tk_trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=special_list, show_progress=False
        )
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = tk_trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=special_list,
            unk_token=specials["unk_token"],
            show_progress=False,
        )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    if algorithm == "wordpiece":
        cls_id = tokenizer.token_to_id(specials["cls_token"])
        sep_id = tokenizer.token_to_id(specials["sep_token"])
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
    return tokenizer
