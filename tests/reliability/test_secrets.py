"""Secrets: tokens given through every source never reach a file lmctl writes (run
directory, checkpoints, caches, pushed objects) nor anything it prints."""

from __future__ import annotations

import os
from pathlib import Path

from tests.reliability.conftest import TINY
from tests.reliability.harness import TALLY, Outcome, forked, record

SECRETS = {
    "flag": "hf_FlagTokenA1b2C3d4E5f6G7h8",
    "hub_token_flag": "hf_HubTokenFlagZ9y8X7w6V5u4",
    "token_file": "hf_TokenFileQ1w2E3r4T5y6U7i8",
    "environment": "hf_EnvironmentP0o9I8u7Y6t5R4",
    "config_token": "hf_ConfigTokenM1n2B3v4C5x6Z7",
    "config_hub_token": "hf_ConfigHubTokenL1k2J3h4G5",
    "training_args_hub_token": "hf_TrainingArgsF1d2S3a4Q5w6",
    "training_args_secret": "TrainingArgsCustomSecret9876",
}


def scan(roots: list[Path], outputs: dict[str, str]) -> list[str]:
    """Every (place, source) where a secret shows up."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            found += [f"{path}: {source}" for source, s in SECRETS.items() if s.encode() in data]
    for name, text in outputs.items():
        found += [f"{name}: {source}" for source, s in SECRETS.items() if s in text]
    return found


def test_no_secret_is_written_or_printed(bpe_tokenizer: Path, corpus: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    token_file = tmp_path / "token.txt"
    token_file.write_text(SECRETS["token_file"] + "\n")
    config = ws / "run.yaml"
    config.write_text(
        f"token: {SECRETS['config_token']}\n"
        f"hub_token: {SECRETS['config_hub_token']}\n"
        "training_args:\n"
        f"  hub_token: {SECRETS['training_args_hub_token']}\n"
        f"  run_name: {SECRETS['training_args_secret']}\n"
        f"  optim_args: 'api_key={SECRETS['training_args_secret']}'\n"
    )
    run = ws / "run"
    published = ws / "published"
    env = {"HF_TOKEN": SECRETS["environment"], "HF_HUB_OFFLINE": "1"}
    train = [
        "train", "clm", "--model-type", "gpt2", "--config-overrides", TINY,
        "--tokenizer-name", str(bpe_tokenizer), "--train-file", str(corpus),
        "--block-size", "32", "--max-steps", "4", "--save-steps", "2", "--no-eval",
        "--config", str(config), "--token", SECRETS["flag"], "-o", str(run),
    ]  # fmt: skip
    commands: dict[str, list[str]] = {
        "train --dry-run": [*train, "--dry-run"],
        "train --dry-run --json": [*train, "--dry-run", "--json"],
        "train --hub-token": [*train, "--hub-token", SECRETS["hub_token_flag"]],
        "train --json": [*train, "--json", "--push-to", f"file://{published}"],
        "resume": ["resume", str(run), "--max-steps", "6", "--json"],
        "eval": ["eval", str(run), "--validation-file", str(corpus), "--json",
                 "-O", str(ws / "m.json")],
        "push file": ["push", str(run), "--to", f"file://{ws / 'pushed'}",
                      "--include-checkpoints"],
        "push hub --token-file": ["push", str(run), "--to", "hf://me/tiny",
                                  "--token-file", str(token_file)],
        "push hub --token": ["push", str(run), "--to", "hf://me/tiny",
                             "--token", SECRETS["flag"], "--json"],
    }  # fmt: skip
    outputs: dict[str, str] = {}
    for number, (name, argv) in enumerate(commands.items()):
        outcome: Outcome = forked(argv, tmp_path / f"log-{number}", env=env)
        record(outcome)
        outputs[f"{name} (stdout)"] = outcome.stdout
        outputs[f"{name} (stderr)"] = outcome.stderr
        assert not outcome.traceback and outcome.code != 1, f"{name}\n{outcome.stderr[-3000:]}"
        if name in ("train --json", "resume", "push file"):
            assert outcome.code == 0, f"{name}\n{outcome.stderr[-3000:]}"
    assert (published / "model.safetensors").is_file()
    assert any(run.glob("checkpoint-*/training_args.bin"))
    caches = [Path(os.environ[name]) for name in ("LMCTL_CACHE", "HF_HOME")]
    found = scan([ws, *caches], outputs)
    found = [hit for hit in found if not hit.startswith(str(config))]
    TALLY.secrets += len(found)
    assert not found, "secrets found:\n" + "\n".join(found)
