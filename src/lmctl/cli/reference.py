"""Artefacts generated from the command tree: the CLI reference and the bash completion.

``scripts/gen_cli_docs.py`` writes :func:`markdown_reference` to ``docs/cli.md`` and
``scripts/gen_completions.py`` writes :func:`bash_completion` to ``completions/lmctl.bash``;
tests fail when either is stale. The bash completion is a static table, so that pressing
TAB answers at once, without starting Python.
"""

from __future__ import annotations

import shlex

from lmctl.cli.help import CommandDoc, OptionDoc, blocks


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _option_names(option: OptionDoc) -> str:
    first = f"`{option.names[0]}{' ' + option.metavar if option.metavar else ''}`"
    return ", ".join([first, *(f"`{name}`" for name in option.names[1:])])


def markdown_reference(root: CommandDoc) -> str:
    """Every command's usage, description, examples and options, as Markdown."""
    commands = list(root.walk())
    lines = [
        "# lmctl command-line reference",
        "",
        "Generated from the app by `python scripts/gen_cli_docs.py`; do not edit by hand.",
        "Every command also answers `--help`.",
        "",
    ]
    for doc in commands:
        anchor = doc.name.replace(" ", "-")
        indent = "  " * (len(doc.path) - 1) if doc.path else ""
        if doc.path:
            lines.append(f"{indent}- [`{doc.name}`](#{anchor}): {doc.summary}")
    for doc in commands:
        lines += ["", f"## {doc.name}", "", "```text", doc.usage(), "```", ""]
        for kind, body in blocks(doc.text or doc.summary):
            lines += (["```bash", body, "```"] if kind == "code" else [body]) + [""]
        for title, options in doc.panels():
            lines += [
                f"**{title}**",
                "",
                "| Option | Description | Default |",
                "| --- | --- | --- |",
            ]
            for option in options:
                default = f"`{option.default}`" if option.default is not None else ""
                lines.append(
                    f"| {_cell(_option_names(option))} | {_cell(option.help)}"
                    + (f" One of: {', '.join(option.choices)}." if option.choices else "")
                    + f" | {_cell(default)} |"
                )
            lines.append("")
        if len(doc.path) == 2 and doc.path[0] == "train":
            lines += _upstream_spellings(doc)
        if doc.children:
            lines += ["| Command | Description |", "| --- | --- |"]
            for child in doc.children:
                anchor = child.name.replace(" ", "-")
                lines.append(f"| [`{child.path[-1]}`](#{anchor}) | {_cell(child.summary)} |")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


UPSTREAM_NOTE = (
    "**Upstream spellings.** `lmctl {command}` also takes the command line of "
    "`{scripts}` unchanged (hidden from `--help`): every option above as upstream spells it, "
    "`--snake_case` beside `--kebab-case` ({examples}), `--flag=value`, the boolean forms "
    "`--do_train`, `--do_train true`, `--do_train=False` and `--no_do_train`, and lists as "
    "several words (`--report_to tensorboard wandb`, `--report_to none`). Besides: every "
    "field of the installed transformers' `TrainingArguments` (`--use_cpu`, `--optim "
    "adamw_torch_fused`, `--lr_scheduler_kwargs '{{\"power\": 2}}'`), parsed with the field's "
    "own type and passed to the Trainer (`--engine accelerate` refuses those it has no "
    "meaning for, by name); the older and no_trainer spellings {renamed}; and an args file as an "
    "argument (`lmctl {command} args.json`, or `.yaml`), which flags override. Where the two "
    "script families differ (`--lr-scheduler-type`'s schedules, `--seed`), the chosen "
    "`--engine` decides. [migrating.md](migrating.md) lists what each upstream flag becomes."
)
#: The upstream scripts of each objective.
UPSTREAM_SCRIPTS = {
    "clm": "run_clm.py` and `run_clm_no_trainer.py",
    "mlm": "run_mlm.py` and `run_mlm_no_trainer.py",
    "plm": "run_plm.py",
    "swag": "run_swag.py` and `run_swag_no_trainer.py",
}


def _upstream_spellings(doc: CommandDoc) -> list[str]:
    from lmctl.config.upstream import RENAMED_KEYS

    flags = [
        option.names[0]
        for option in doc.options
        if not option.argument and option.names[0].startswith("--") and "-" in option.names[0][2:]
    ]
    examples = ", ".join(f"`{flag[:2] + flag[2:].replace('-', '_')}`" for flag in flags[:4])
    renamed = ", ".join(
        f"`--{old}` (`--{'no-' if convert else ''}{new.replace('_', '-')}`)"
        for old, (new, convert) in RENAMED_KEYS.items()
    )
    note = UPSTREAM_NOTE.format(
        command=" ".join(doc.path),
        scripts=UPSTREAM_SCRIPTS.get(doc.path[1], f"run_{doc.path[1]}.py"),
        examples=examples + ", ...",
        renamed=renamed
        + ", `--with_tracking`, `--checkpointing_steps N|epoch`, `--hub_token` (`--token`), "
        "`--push_to_hub --hub_model_id NS/REPO` (`--push-to hf://NS/REPO`)",
    )
    return [note, ""]


def _words(items: list[str]) -> str:
    return shlex.quote(" ".join(items))


def bash_completion(root: CommandDoc) -> str:
    """A bash completion function for ``lmctl``: subcommands, options and choices."""
    commands = list(root.walk())
    key = {id(doc): "/" + "/".join(doc.path) if doc.path else "" for doc in commands}
    paths = "|".join(shlex.quote(key[id(doc)]) for doc in commands if doc.path)
    tables = []
    values = []
    for doc in commands:
        names = [name for option in doc.options if not option.argument for name in option.names]
        children = [child.path[-1] for child in doc.children]
        tables.append(
            f"        {shlex.quote(key[id(doc)])}) commands={_words(children)}; "
            f"options={_words(names)} ;;"
        )
        free: list[str] = []  # options whose value is anything (bash completes file names)
        for option in doc.options:
            if option.argument or not option.takes_value:
                continue
            patterns = [shlex.quote(f"{key[id(doc)]} {name}") for name in option.names]
            if option.choices:
                reply = f'COMPREPLY=($(compgen -W {_words(option.choices)} -- "$cur"))'
                values.append(f"        {'|'.join(patterns)}) {reply}; return ;;")
            else:
                free += patterns
        if free:
            values.append(f"        {'|'.join(free)}) COMPREPLY=(); return ;;")
    return "\n".join(
        [
            "# bash completion for lmctl: generated by scripts/gen_completions.py from the app.",
            "# A static table, so completion answers without starting Python.",
            "_lmctl_completion() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
            '    local path="" word i commands="" options=""',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        word="${COMP_WORDS[i]}"',
            '        case "$path/$word" in',
            f'            {paths}) path="$path/$word" ;;',
            "        esac",
            "    done",
            '    case "$path" in',
            *tables,
            "    esac",
            '    case "$path $prev" in',
            *values,
            "    esac",
            "    if [[ $cur == -* ]]; then",
            '        COMPREPLY=($(compgen -W "$options" -- "$cur"))',
            "    elif [[ -n $commands ]]; then",
            '        COMPREPLY=($(compgen -W "$commands" -- "$cur"))',
            "    else",
            "        COMPREPLY=()",
            "    fi",
            "}",
            "",
            "complete -o default -F _lmctl_completion lmctl",
            "",
        ]
    )
