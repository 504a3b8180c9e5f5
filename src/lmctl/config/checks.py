"""The shared cross-field rules of ``lmctl train``, one function per slice they concern.

Each rule reads the slices of :mod:`lmctl.config.slices` it is about (never the whole
document) and adds what it finds to a :class:`~lmctl.config.problems.Problems`, so that the
user sees every problem at once. Objectives add their own rules in their document classes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from lmctl import install_hint
from lmctl.config.fields import flag_name
from lmctl.config.problems import Problems
from lmctl.config.slices import (
    AdapterSpec,
    ComputeSpec,
    DataSpec,
    LaunchSpec,
    LoopSpec,
    ModelSpec,
    OptimizerSpec,
    PublishSpec,
    RunDirSpec,
    ScaleSpec,
    TokenizerSpec,
)
from lmctl.config.values import (
    ACCELERATE_TRAINING_ARGS,
    DATA_EXTENSIONS,
    DEEPSPEED_STAGES,
    SCHEDULER_KWARGS,
    FastPathName,
)
from lmctl.storage.paths import (
    data_extension,
    has_glob,
    is_remote,
    local_folder_problem,
    local_path,
    looks_like_path,
    matching_files,
    url_scheme,
)

#: Commands that read data without a model (``lmctl prepare``, ``lmctl data inspect``).
DATA_ONLY_COMMANDS = ("prepare", "inspect")

_OVERRIDE_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^,=]*$")


def require_package(problems: Problems, package: str, flag: str) -> None:
    """An optional extra that a flag needs; found without importing it."""
    from importlib.util import find_spec

    if find_spec(package) is None:
        problems.add(
            f"{flag} needs the {package} package, which is not installed",
            install_hint(package),
        )


def check_model(model: ModelSpec, tokenizer: TokenizerSpec, problems: Problems) -> None:
    """A model to train, its overrides, and a tokenizer for it."""
    if model.config_overrides is not None:
        if model.from_pretrained or model.config_name is not None:
            problems.add(
                "--config-overrides can't be used with --model-name-or-path or --config-name",
                "drop --config-overrides, or train from scratch with --model-type",
            )
        else:
            for item in model.config_overrides.split(","):
                if not _OVERRIDE_ITEM.match(item.strip()):
                    problems.add(
                        f"--config-overrides: '{item}' is not key=value",
                        "write it as comma-separated key=value pairs, e.g. n_layer=2,n_head=4",
                    )
                    break
    name = model.model_name_or_path or ""
    # Said now, not after the libraries that would load the model are imported (seconds).
    if looks_like_path(name) and not is_remote(name) and not local_path(name).exists():
        problems.add(f"--model-name-or-path {name}: no such directory", "check the path")
    preparing = problems.command in DATA_ONLY_COMMANDS
    if not model.given and not preparing:
        problems.add(
            "no model: give --model-name-or-path, --config-name or --model-type",
            "e.g. --model ./my-model, or --model-type gpt2 to train from scratch",
        )
    if tokenizer.train_tokenizer is not None:
        if model.from_pretrained:
            problems.add(
                "--train-tokenizer only applies when training from scratch",
                "drop --train-tokenizer; a pretrained model keeps its own tokenizer",
            )
        if tokenizer.tokenizer_name is not None:
            problems.add(
                "--train-tokenizer and --tokenizer-name can't be used together",
                "choose one: train a new tokenizer or load an existing one",
            )
    elif not model.from_pretrained and tokenizer.tokenizer_name is None:
        problems.add(
            "preparing data needs a tokenizer"
            if preparing
            else "training from scratch needs a tokenizer",
            "give --tokenizer-name DIR, or --train-tokenizer VOCAB_SIZE to train one on "
            "the training data",
        )


def check_imports(model: ModelSpec, problems: Problems) -> None:
    for name in model.imports:
        if name.endswith(".py") and not local_path(name).is_file():
            problems.add(f"--import {name}: no such file", "check the path of the .py file")


def check_data(
    data: DataSpec, tokenizer: TokenizerSpec, loop: LoopSpec, problems: Problems
) -> None:
    """Data to train and evaluate on, of a readable kind."""
    check_sources(data, problems)
    no_data = (
        data.dataset_name is None
        and data.train_file is None
        and data.validation_file is None
        and not data.train_sources
        and not data.validation_sources
    )
    if no_data:
        problems.add(
            "no data: give --dataset-name or --train-file/--validation-file",
            "e.g. --train-file corpus.txt",
        )
    for name in ("train_file", "validation_file"):
        path = getattr(data, name)
        if path is None:
            continue
        ext = data_extension(path)
        if not is_remote(path) and local_path(path).is_dir():
            pattern = str(Path(path) / "*.txt")
            problems.add(
                f"{flag_name(name)} {path}: is a directory, not a data file",
                f"give one file in it, or all of its files of one type as a quoted pattern, "
                f"e.g. {flag_name(name)} '{pattern}'",
            )
        elif ext not in DATA_EXTENSIONS:
            problems.add(
                f"{flag_name(name)} {path}: unsupported file type '.{ext}'",
                "use a " + ", ".join(DATA_EXTENSIONS) + " file",
            )
        elif not is_remote(path) and not matching_files(path):
            problems.add(
                f"{flag_name(name)} {path}: "
                + ("no file matches" if has_glob(path) else "no such file"),
                "check the path (relative paths start from the current directory)",
            )
    if (
        data.train_file is not None
        and data.validation_file is not None
        and data_extension(data.train_file) != data_extension(data.validation_file)
    ):
        problems.add(
            "--train-file and --validation-file must have the same file type",
            "convert one of them so both are txt, csv, json/jsonl or parquet",
        )
    no_train_data = data.train_file is None and not data.dataset_name and not data.train_sources
    # With no data at all, the one "no data" problem above says it all.
    if not no_data and loop.do_train and no_train_data:
        problems.add("--do-train needs training data", "give --train-file or --dataset-name")
    if not no_data and tokenizer.train_tokenizer is not None and no_train_data:
        problems.add("--train-tokenizer needs training data to learn from", "give --train-file")


def check_sources(data: DataSpec, problems: Problems) -> None:
    """Named sources: unique names, files of a readable kind, weights for training only, and
    not beside the single-source flags of the same split."""
    for field_name, sources in (
        ("train_sources", data.train_sources),
        ("validation_sources", data.validation_sources),
    ):
        seen: set[str] = set()
        for index, source in enumerate(sources):
            where = f"{field_name}[{index}]"
            if source.name in seen:
                problems.add(
                    f"{where}.name: '{source.name}' names another source of {field_name} too",
                    "give every source its own name (it is part of the metric names): "
                    "'name:' in a config file, NAME=VALUE on the command line",
                )
            seen.add(source.name)
            if source.file is not None:
                ext = data_extension(source.file)
                if ext not in DATA_EXTENSIONS:
                    problems.add(
                        f"{where}.file {source.file}: unsupported file type '.{ext}'",
                        "use a " + ", ".join(DATA_EXTENSIONS) + " file",
                    )
                elif not is_remote(source.file) and not matching_files(source.file):
                    problems.add(
                        f"{where}.file {source.file}: "
                        + ("no file matches" if has_glob(source.file) else "no such file"),
                        "check the path (relative paths start from the current directory)",
                    )
            if field_name == "validation_sources" and source.weight is not None:
                problems.add(
                    f"{where}.weight: validation sources are not mixed, each is evaluated whole",
                    "drop the weight",
                )
    weighted = [source.weight is not None for source in data.train_sources]
    if any(weighted) and not all(weighted):
        problems.add(
            "train_sources: some sources have a weight and others not",
            "give every training source a weight, or none (equal shares)",
        )
    if data.train_sources and (data.train_file is not None or data.dataset_name is not None):
        problems.add(
            "train_sources and --train-file/--dataset-name both name the training data",
            "add the file or dataset to train_sources as one more source",
        )
    if data.validation_sources and data.validation_file is not None:
        problems.add(
            "validation_sources and --validation-file both name the evaluation data",
            "add the file to validation_sources as one more source",
        )


def check_streaming(data: DataSpec, loop: LoopSpec, problems: Problems) -> None:
    if data.streaming and problems.command == "prepare":
        problems.add(
            "lmctl prepare fills the cache that non-streaming runs read; it does not stream",
            "drop 'streaming' from the config",
        )
    elif (
        data.streaming
        and loop.do_train
        and loop.max_steps is None
        and problems.command != "inspect"
    ):
        problems.add(
            "--streaming needs --max-steps: a stream has no length to count epochs in",
            "give the number of optimizer steps, e.g. --max-steps 10000",
        )
    if (
        data.streaming
        and loop.do_eval
        and data.train_sources
        and not data.validation_sources
        and data.validation_file is None
    ):
        problems.add(
            "train_sources with --streaming: no validation data (a stream cannot hold a "
            "percentage of a mixture out)",
            "give validation_sources or --validation-file, or --no-eval",
        )


def check_precision(compute: ComputeSpec, problems: Problems) -> None:
    if compute.bf16 and compute.fp16:
        problems.add("--bf16 and --fp16 can't both be set", "choose one precision")
    elif compute.precision is not None and (compute.bf16 or compute.fp16):
        flag = "--bf16" if compute.bf16 else "--fp16"
        if compute.precision != flag[2:]:
            problems.add(f"--precision {compute.precision} contradicts {flag}", "keep one of them")


def check_fast_paths(compute: ComputeSpec, problems: Problems) -> None:
    known = get_args(FastPathName)
    unknown = sorted((compute.fast_path_names() or frozenset()) - set(known))
    if unknown:
        problems.add(
            f"--fast-paths {compute.fast_paths}: {', '.join(repr(n) for n in unknown)} "
            f"{'is not a fast path' if len(unknown) == 1 else 'are not fast paths'}",
            f"give auto, off, or a comma-separated list of: {', '.join(known)}",
        )


def check_schedule(
    loop: LoopSpec, optimizer: OptimizerSpec, problems: Problems, *, resuming: bool
) -> None:
    """Warmup, evaluation and schedule settings that fit together."""
    if optimizer.restart_schedule and not resuming:
        problems.add(
            "--restart-schedule applies only to a resumed run",
            "use it with 'lmctl resume RUN_DIR --max-steps N', or drop it",
        )
    if optimizer.warmup_ratio is not None and optimizer.warmup_steps:
        problems.add(
            "--warmup-ratio and --warmup-steps can't both be set", "choose one warmup form"
        )
    if loop.eval_strategy == "steps" and loop.eval_steps is None:
        problems.add("--eval-strategy steps needs --eval-steps", "e.g. --eval-steps 100")
    if optimizer.lr_scheduler_type == "reduce_lr_on_plateau" and loop.eval_strategy == "no":
        problems.add(
            "--lr-scheduler-type reduce_lr_on_plateau needs evaluations during training",
            "add --eval-strategy epoch (or steps with --eval-steps)",
        )
    needed = SCHEDULER_KWARGS.get(optimizer.lr_scheduler_type)
    given = loop.training_args.get("lr_scheduler_kwargs") or {}
    if needed and not any(key in given for key in needed):
        problems.add(
            f"--lr-scheduler-type {optimizer.lr_scheduler_type} needs "
            f"training_args.lr_scheduler_kwargs.{' or '.join(needed)}",
            f"set it in the config file, e.g. training_args: {{lr_scheduler_kwargs: "
            f"{{{needed[0]}: ...}}}}",
        )


def check_engine(loop: LoopSpec, problems: Problems) -> None:
    """Settings the engine takes, and work to do."""
    if loop.engine == "accelerate":
        ignored = sorted(set(loop.training_args) - ACCELERATE_TRAINING_ARGS)
        if ignored:
            problems.add(
                f"training_args {', '.join(ignored)} (or --{', --'.join(ignored)}): not "
                "used by --engine accelerate (it takes "
                f"{', '.join(sorted(ACCELERATE_TRAINING_ARGS))})",
                "remove them, or use --engine trainer",
            )
    if not (loop.do_train or loop.do_eval):
        problems.add("nothing to do: both training and evaluation are off", "drop --no-train")


def check_launch(
    launch: LaunchSpec, run_dir: RunDirSpec, changed: set[str], problems: Problems
) -> None:
    """``changed``: the document's fields that differ from their defaults."""
    if launch.nproc is None:
        for name in ("nnodes", "node_rank", "master_addr", "master_port", "max_restarts"):
            if name in changed:
                problems.add(
                    f"{flag_name(name)} only applies with --nproc",
                    "add --nproc N (processes per machine), or drop it",
                )
    if launch.nnodes > 1 and launch.master_addr is None:
        problems.add(
            f"--nnodes {launch.nnodes} needs --master-addr",
            "give the address of the machine started with --node-rank 0",
        )
    if launch.min_nnodes is not None:
        _check_machine_range(launch, run_dir, problems)
    if launch.node_rank >= launch.nnodes:
        problems.add(
            f"--node-rank {launch.node_rank} is not below --nnodes {launch.nnodes}",
            "number the machines 0 .. nnodes-1",
        )


def _check_machine_range(launch: LaunchSpec, run_dir: RunDirSpec, problems: Problems) -> None:
    """``--nnodes MIN:MAX``: machines leave and join the run only when it restarts."""
    given = f"--nnodes {launch.min_nnodes}:{launch.nnodes}"
    if launch.min_nnodes is not None and launch.min_nnodes > launch.nnodes:
        problems.add(f"{given}: MIN is above MAX", "give MIN:MAX with MIN at most MAX")
    if launch.max_restarts == 0:
        problems.add(
            f"{given} needs --max-restarts N: machines leave or join a run when it restarts",
            "add --max-restarts N, or give --nnodes N",
        )
    if launch.launcher != "torchrun":
        problems.add(
            f"{given}: --launcher {launch.launcher} has no range of machines",
            "use --launcher torchrun (the default)",
        )
    if run_dir.output_dir is not None and url_scheme(run_dir.output_dir) is not None:
        problems.add(
            f"{given}: a run directory in object storage ({run_dir.output_dir}) continues "
            "on a fixed number of machines",
            "write the run to a directory every machine shares, or give --nnodes N",
        )


def check_scale(scale: ScaleSpec, loop: LoopSpec, changed: set[str], problems: Problems) -> None:
    """DeepSpeed or FSDP, with what each needs."""
    if scale.deepspeed is not None:
        if scale.fsdp:
            problems.add("--deepspeed and --fsdp can't be used together", "choose one way to shard")
        if scale.deepspeed not in DEEPSPEED_STAGES and not local_path(scale.deepspeed).is_file():
            problems.add(
                f"--deepspeed {scale.deepspeed}: no such file, and not a ZeRO stage",
                "give a DeepSpeed config .json file, or 1, 2 or 3 for a shipped one",
            )
    if scale.deepspeed is not None or "deepspeed" in loop.training_args:
        require_package(problems, "deepspeed", "--deepspeed")
    if scale.fsdp and scale.fsdp_sharding == "hybrid" and loop.engine == "accelerate":
        problems.add(
            "--fsdp-sharding hybrid is not available with --engine accelerate",
            "use --engine trainer, or --fsdp-sharding full",
        )
    if not scale.fsdp:
        for name in ("fsdp_sharding", "fsdp_auto_wrap", "fsdp_cpu_offload"):
            if name in changed:
                problems.add(f"{flag_name(name)} needs --fsdp", "add --fsdp, or drop it")


def check_adapter(
    adapter: AdapterSpec, model: ModelSpec, changed: set[str], problems: Problems
) -> None:
    if adapter.peft is None:
        for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
            if name in changed:
                problems.add(f"{flag_name(name)} needs --peft lora", "add --peft lora")
        if adapter.merge_adapter:
            problems.add("--merge-adapter needs --peft lora", "add --peft lora")
        return
    require_package(problems, "peft", "--peft")
    if model.model_name_or_path is None and problems.command not in DATA_ONLY_COMMANDS:
        problems.add(
            "--peft lora adapts a pretrained model",
            "give --model-name-or-path, or train every weight (drop --peft)",
        )


def check_publish(publish: PublishSpec, loop: LoopSpec, problems: Problems) -> None:
    from lmctl.errors import ConfigError
    from lmctl.storage.locations import parse_location

    if publish.push_to is None:
        return
    try:
        location = parse_location(publish.push_to, "--push-to")
    except ConfigError as exc:
        problems.add(exc.message, exc.hint or "")
        return
    if publish.push_private and not location.is_hub:
        problems.add(
            "--push-private only applies to a Hub destination (hf://)",
            "drop --push-private, or push to hf://NAMESPACE/REPO",
        )
    if not loop.do_train:
        problems.add(
            "--push-to needs --do-train: there is no trained model to publish",
            "drop --push-to, or publish an existing model with 'lmctl push DIR --to DEST'",
        )


def check_locations(
    run_dir: RunDirSpec,
    data: DataSpec,
    access_cache_dir: str | None,
    logging_dir: str | None,
    problems: Problems,
) -> None:
    """Folder options given a URL: the run directory may be remote (see
    :mod:`lmctl.storage.locations`), the others live on the local disk; no URL is ever taken
    for a local path."""
    from lmctl.storage.locations import run_location_problem

    found = [
        run_location_problem("--output-dir", run_dir.output_dir),
        local_folder_problem(
            "--resume-from-checkpoint",
            run_dir.resume_from_checkpoint,
            "to continue a run kept in a bucket, run 'lmctl resume URL'",
        ),
    ]
    for flag, value in (
        ("--prepared-cache-dir", data.prepared_cache_dir),
        ("--cache-dir", access_cache_dir),
        ("--staging-dir", run_dir.staging_dir),
    ):
        found.append(local_folder_problem(flag, value, "give a folder on the local disk"))
    found.append(
        local_folder_problem(
            "training_args.logging_dir",
            logging_dir,
            "give a folder on the local disk (by default the logs go into the run "
            "directory's runs/ folder)",
        )
    )
    for problem in found:
        if problem is not None:
            problems.add(*problem)
    checkpoint = run_dir.resume_from_checkpoint
    if (
        checkpoint not in (None, "auto")
        and url_scheme(checkpoint) is None
        and not local_path(checkpoint).is_dir()
    ):
        problems.add(
            f"--resume-from-checkpoint {checkpoint}: no such directory",
            "give a checkpoint directory, or 'auto' for the newest in --output-dir",
        )


def check_document(document: Any, problems: Problems) -> None:
    """The shared cross-field rules of a config document: one function below per slice they
    concern."""
    from lmctl.config.slices import SHARED_SLICES, take

    cut: dict[str, Any] = {name: take(kind, document) for name, kind in SHARED_SLICES.items()}
    model, data, loop = cut["model"], cut["data"], cut["loop"]
    changed = {
        name
        for name, info in type(document).model_fields.items()
        if getattr(document, name) != info.default
    }
    check_model(model, cut["tokenizer"], problems)
    check_data(data, cut["tokenizer"], loop, problems)
    check_imports(model, problems)
    check_precision(cut["compute"], problems)
    resuming = document.resume_from_checkpoint is not None
    check_schedule(loop, cut["optimizer"], problems, resuming=resuming)
    check_fast_paths(cut["compute"], problems)
    check_engine(loop, problems)
    check_launch(cut["launch"], cut["run_dir"], changed, problems)
    check_scale(cut["scale"], loop, changed, problems)
    check_adapter(cut["adapter"], model, changed, problems)
    check_publish(cut["publish"], loop, problems)
    check_streaming(data, loop, problems)
    logging_dir = document.training_args.get("logging_dir")
    check_locations(cut["run_dir"], data, document.cache_dir, logging_dir, problems)
