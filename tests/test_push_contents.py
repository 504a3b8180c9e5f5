"""What a push publishes: a model card without local paths that lists the settings that
decided the run, and a checkpoint's model files without its training state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import lmctl

pytestmark = pytest.mark.e2e

TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}


@pytest.fixture(scope="module")
def finetuned(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> tuple[Path, Path]:
    """A run fine-tuned from a local model directory, with one checkpoint."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    work = tmp_path_factory.mktemp("finetune")
    base = work / "site-packages" / "my-gpt2"
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=len(tokenizer),
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(base)
    tokenizer.save_pretrained(base)
    train, valid = text_files
    out = work / "run"
    proc = lmctl(
        "train",
        "clm",
        "--model",
        base,
        "--train-file",
        train,
        "--validation-file",
        valid,
        "--block-size",
        "32",
        "--max-steps",
        "2",
        "--save-steps",
        "2",
        "--output-dir",
        out,
        cwd=work,
    )
    assert proc.returncode == 0, proc.stderr
    return base, out


def card_metadata(card: str) -> dict[str, object]:
    import yaml

    data: dict[str, object] = yaml.safe_load(card.split("---")[1])
    return data


def test_model_card_names_the_base_model_without_local_paths(
    finetuned: tuple[Path, Path], tmp_path: Path
) -> None:
    base, out = finetuned
    card = (out / "README.md").read_text()
    assert card_metadata(card)["base_model"] == "my-gpt2"
    assert "fine-tuned from `my-gpt2`" in card
    assert str(base.parent) not in card.split("## Training")[0]
    table = card.split("| hyperparameter | value |")[1].split("## Framework")[0]
    assert "| max_steps | 2 |" in table
    assert "num_train_epochs" not in table and "warmup_steps" not in table

    # The model's config remembers another model (its _name_or_path): the card still names
    # the base model as the user named it.
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(
        json.dumps({**config, "_name_or_path": "openai-community/gpt2"})
    )
    dest = tmp_path / "dest"
    proc = lmctl("push", out, "--to", dest.as_uri())
    assert proc.returncode == 0, proc.stderr
    assert card_metadata((dest / "README.md").read_text())["base_model"] == "my-gpt2"

    # The published config names local files and folders by their names only; the run's own
    # keeps its absolute paths (resume and eval read it from anywhere).
    published = (dest / "lmctl.yaml").read_text()
    assert str(base.parent) not in published and str(out) not in published
    shared, kept = yaml.safe_load(published), yaml.safe_load((out / "lmctl.yaml").read_text())
    assert (shared["model_name_or_path"], shared["output_dir"]) == ("my-gpt2", "run")
    assert shared["train_file"] == Path(kept["train_file"]).name
    assert kept["model_name_or_path"] == str(base)


def test_a_checkpoint_is_pushed_without_its_training_state(
    finetuned: tuple[Path, Path], tmp_path: Path
) -> None:
    _, out = finetuned
    checkpoint = out / "checkpoint-2"
    assert {p.name for p in checkpoint.iterdir()} >= TRAINING_STATE
    dest = tmp_path / "dest"

    proc = lmctl("push", checkpoint, "--to", dest.as_uri(), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    names = {item["path"] for item in listing["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not names & TRAINING_STATE and "training_args.bin" not in names
    assert set(listing["left_out"]) >= TRAINING_STATE
    assert listing["delete"] == []

    full = lmctl(
        "push", checkpoint, "--to", dest.as_uri(), "--dry-run", "--include-optimizer", "--json"
    )
    assert full.returncode == 0, full.stderr
    assert {item["path"] for item in json.loads(full.stdout)["files"]} >= TRAINING_STATE

    # A destination that holds another model: the dry run names the files it would delete.
    first = lmctl("push", out, "--to", dest.as_uri())
    assert first.returncode == 0, first.stderr
    proc = lmctl("push", checkpoint, "--to", dest.as_uri(), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would delete" in proc.stdout
    listed = proc.stdout.split("would delete", 1)[1]
    for name in ("all_results.json", "lmctl.yaml", "README.md", "metrics.jsonl"):
        assert f"  {name}\n" in listed, proc.stdout
    assert "  model.safetensors\n" not in listed

    pushed = lmctl("push", checkpoint, "--to", dest.as_uri())
    assert pushed.returncode == 0, pushed.stderr
    published = {p.name for p in dest.iterdir()}
    assert "model.safetensors" in published and not published & TRAINING_STATE
    assert "all_results.json" not in published


def test_every_process_stream_position_is_training_state() -> None:
    from lmctl.publish.files import _is_state

    for name in ("stream_position.json", "stream_position-1.json", "stream_position-12.json"):
        assert _is_state((name,)), name
    assert not _is_state(("config.json",))
