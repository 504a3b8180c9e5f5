"""``lmctl prepare <objective>``: tokenize and group data into the prepared-data cache ahead of
training. Flags are the objective's data, model and objective options; a training config file
works as is (its training options are ignored)."""

from __future__ import annotations

from typing import Any

import typer
from pydantic.fields import FieldInfo

from lmctl.cli.help import CommandDoc, add_command, add_group
from lmctl.cli.train import objective_command
from lmctl.config.fields import PANEL_DATA, PANEL_MODEL, PANEL_OBJECTIVE, field_extra
from lmctl.console import Console
from lmctl.objectives import OBJECTIVES, get_objective

#: Panels whose options decide the prepared data; plus the two switches that pick the splits.
PANELS = (PANEL_MODEL, PANEL_DATA, PANEL_OBJECTIVE)
EXTRA_FIELDS = ("do_train", "do_eval")
#: Options of those panels that do not change the prepared data.
SKIPPED_FIELDS = ("streaming", "shuffle_buffer_size", "dtype")

EXAMPLES = """
Prepare once, then train as often as you like without tokenizing again:

    lmctl prepare {name} --train-file corpus.txt --tokenizer-name ./tok
    lmctl train {name} --model ./gpt2-small --train-file corpus.txt

With the config file the training run will use (same cache key, training options ignored):

    lmctl prepare {name} --config run.yaml --preprocessing-num-workers 8
"""


def decides_data(name: str, info: FieldInfo) -> bool:
    if name in EXTRA_FIELDS:
        return True
    return field_extra(info).get("panel") in PANELS and name not in SKIPPED_FIELDS


def _make_command(name: str) -> Any:
    doc = (
        f"Prepare {name} training data ({get_objective(name).summary}).\n\n"
        f"{EXAMPLES.format(name=name)}"
    )
    return objective_command(name, "prepare", run_prepare, doc, include=decides_data)


def run_prepare(
    name: str,
    cli_values: dict[str, Any],
    config_file: str | None,
    dry_run: bool,
    console: Console,
) -> dict[str, Any]:
    from lmctl.config.loader import build_config, dump_config

    objective = get_objective(name)
    config = build_config(
        objective.config_class,
        cli_values=cli_values,
        config_file=config_file,
        objective=name,
        command="prepare",
    )
    if dry_run:
        resolved = {"objective": name, **dump_config(config, masked=True)}
        if not console.options.json:
            import yaml

            console.write(yaml.safe_dump(resolved, sort_keys=False))
        return {"dry_run": True, "config": resolved}
    from lmctl.config.slices import slice_config
    from lmctl.data.prepared import cache_root, describe
    from lmctl.data.stream.sources import Readers
    from lmctl.distributed import world_size
    from lmctl.pipeline import prepare_data

    spec = slice_config(config, objective.options_class)
    readers = Readers(world_size(), spec.loop.dataloader_num_workers)
    prepared = prepare_data(spec, objective, console, readers=readers)
    splits = {
        split: describe(dataset)
        for split, dataset in (
            ("train", prepared.train_dataset),
            ("validation", prepared.eval_dataset),
        )
        if dataset is not None
    }
    rows = {split: info["rows"] for split, info in splits.items()}
    console.summary(f"lmctl prepare {name}: {cache_root(spec.data)}", rows)
    return {
        "cache_dir": str(cache_root(spec.data)),
        "splits": splits,
        "data_seconds": round(prepared.data_seconds, 3),
    }


def register(app: typer.Typer, parent: CommandDoc) -> None:
    group, doc = add_group(
        app,
        parent,
        "prepare",
        "Tokenize and group data into the prepared-data cache that training reuses.",
    )
    for name in OBJECTIVES:
        summary = f"Prepare data for: {get_objective(name).summary}"
        add_command(group, doc, name, _make_command(name), summary)
