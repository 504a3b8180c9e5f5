"""Scale options without launching anything: validation, the shipped DeepSpeed configs, what
each engine is handed, the launcher command of --nproc, and the world-size rule of resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from lmctl.resources import DEEPSPEED_CONFIGS, deepspeed_config
from tests.conftest import assert_clean_failure, lmctl, runtime_of, sliced

EXAMPLES = Path(__file__).parent.parent / "examples" / "deepspeed"


def _config(tmp_path: Path, **values: Any) -> ClmConfig:
    train = tmp_path / "t.txt"
    train.write_text("hello\n")
    base = {"model_type": "gpt2", "tokenizer_name": "x", "train_file": str(train)}
    return build_config(ClmConfig, cli_values={**base, **values})


def test_shipped_deepspeed_configs_are_the_examples_and_parse() -> None:
    from transformers.integrations import HfDeepSpeedConfig

    shipped = {path.name: path for path in DEEPSPEED_CONFIGS.glob("*.json")}
    assert set(shipped) == {"zero1.json", "zero2.json", "zero3.json", "zero3_offload.json"}
    assert {path.name for path in EXAMPLES.glob("*.json")} == set(shipped)
    for name, path in shipped.items():
        assert (EXAMPLES / name).read_text() == path.read_text(), name
        data = json.loads(path.read_text())
        expected = int(name[4])
        assert data["zero_optimization"]["stage"] == expected
        parsed = HfDeepSpeedConfig(str(path))
        assert parsed.is_zero3() == (expected == 3)
        assert parsed.is_offload() == ("offload" in name)


def test_deepspeed_stage_names_a_shipped_config(tmp_path: Path) -> None:
    from lmctl.engine.trainer import training_arguments

    config = _config(tmp_path, deepspeed="2", gradient_checkpointing=True)
    assert config.deepspeed == "2"
    from lmctl.engine.sharding import trainer_options

    values = trainer_options(sliced(config).scale, config.gradient_checkpointing)
    assert values["deepspeed"] == str(deepspeed_config("2"))
    assert values["gradient_checkpointing"] is True
    fsdp = trainer_options(sliced(_config(tmp_path, fsdp=True, fsdp_sharding="grad-op",
                                          fsdp_auto_wrap=True, fsdp_cpu_offload=True)).scale,
                           False)  # fmt: skip
    assert fsdp["fsdp"] == "shard_grad_op auto_wrap offload"
    assert fsdp["fsdp_config"] == {"version": 2}
    config = _config(tmp_path, fsdp=True)
    args = training_arguments(sliced(config), runtime_of(config, tmp_path), tmp_path / "run")
    assert args.fsdp_config["version"] == 2


def test_deepspeed_file_is_recorded_by_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    monkeypatch.chdir(tmp_path)
    assert _config(tmp_path, deepspeed="ds.json").deepspeed == str(tmp_path / "ds.json")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--deepspeed", "4"], "--deepspeed 4: no such file, and not a ZeRO stage"),
        (["--deepspeed", "2", "--fsdp"], "--deepspeed and --fsdp can't be used together"),
        (["--fsdp-cpu-offload"], "--fsdp-cpu-offload needs --fsdp"),
        (["--fsdp-sharding", "grad-op"], "--fsdp-sharding needs --fsdp"),
        (["--nnodes", "2"], "--nnodes only applies with --nproc"),
        (["--nproc", "2", "--nnodes", "2"], "--nnodes 2 needs --master-addr"),
        (["--nproc", "2", "--node-rank", "1"], "--node-rank 1 is not below --nnodes 1"),
        (["--max-restarts", "2"], "--max-restarts only applies with --nproc"),
        (
            ["--fsdp", "--fsdp-sharding", "hybrid", "--engine", "accelerate"],
            "--fsdp-sharding hybrid is not available with --engine accelerate",
        ),
    ],
)
def test_scale_mistakes_exit_2_naming_the_flag(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    corpus = tmp_path / "a.txt"
    corpus.write_text("hello world\n")
    proc = lmctl(
        "train", "clm", "--model-type", "gpt2", "--tokenizer", "x", "--train-file", corpus,
        *flags, "--dry-run",
    )  # fmt: skip
    assert_clean_failure(proc, 2, message)


def test_deepspeed_without_the_package_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name)
    )
    for values in ({"deepspeed": "2"}, {"training_args": {"deepspeed": "ds.json"}}):
        with pytest.raises(ConfigError) as caught:
            _config(tmp_path, **values)
        assert "needs the deepspeed package" in caught.value.message
        assert "pip install 'lmctl-train[deepspeed]'" in (caught.value.hint or "")


def test_launcher_commands(tmp_path: Path) -> None:
    from lmctl.config.slices import LaunchSpec, take
    from lmctl.run.launch import launcher_command

    argv = ["train", "clm", "--nproc", "2", "--max-steps", "5", "--launcher=torchrun"]
    command = launcher_command(take(LaunchSpec, _config(tmp_path, nproc=2)), argv)
    assert command == [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
        "-m", "lmctl", "train", "clm", "--max-steps", "5",
    ]  # fmt: skip
    two_nodes = _config(tmp_path, nproc=4, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    assert launcher_command(take(LaunchSpec, two_nodes), ["train", "clm"])[3:14] == [
        "--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "-m",
    ]  # fmt: skip
    accelerate = launcher_command(
        take(LaunchSpec, _config(tmp_path, nproc=2, launcher="accelerate", master_port=1234)),
        ["train", "clm"],
    )
    assert accelerate[1:3] == ["-m", "accelerate.commands.launch"]
    assert accelerate[accelerate.index("--num_processes") + 1] == "2"
    assert accelerate[accelerate.index("--main_process_port") + 1] == "1234"
    # Without --master-port, accelerate gets a free port of its own (0), not 29500, which a
    # second run on this machine would be refused or race for.
    free = launcher_command(
        take(LaunchSpec, _config(tmp_path, nproc=2, launcher="accelerate")), ["train", "clm"]
    )
    assert free[free.index("--main_process_port") + 1] == "0"


def test_launcher_commands_with_restarts(tmp_path: Path) -> None:
    """--max-restarts reaches torchrun's elastic agent, through either launcher; several
    machines meet through the elastic rendezvous, hosted by the machine of --node-rank 0;
    every attempt meets in a store of its own."""
    from lmctl.config.slices import LaunchSpec, take
    from lmctl.run.launch import launcher_command, launcher_environment

    one = _config(tmp_path, nproc=2, max_restarts=3)
    assert launcher_command(
        take(LaunchSpec, one), ["train", "clm", "--max-restarts", "3"]
    )[3:8] == [
        "--nproc_per_node", "2", "--standalone", "--max_restarts", "3",
    ]  # fmt: skip
    assert launcher_environment(take(LaunchSpec, one)) == {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"
    }
    two = _config(tmp_path, nproc=4, nnodes=2, node_rank=1, master_addr="10.0.0.1", max_restarts=3)
    assert launcher_command(take(LaunchSpec, two), ["train", "clm"])[3:16] == [
        "--nproc_per_node", "4", "--nnodes", "2", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "10.0.0.1:29500", "--rdzv_conf", "is_host=0", "--max_restarts", "3",
        "-m",
    ]  # fmt: skip
    accelerate = launcher_command(
        take(LaunchSpec, two.model_copy(update={"launcher": "accelerate"})), []
    )
    assert accelerate[accelerate.index("--max_restarts") + 1] == "3"
    assert accelerate[accelerate.index("--rdzv_backend") + 1] == "c10d"
    assert accelerate[accelerate.index("--rdzv_conf") + 1] == "is_host=0"
    alone = _config(tmp_path, nproc=2, max_restarts=1, launcher="accelerate")
    assert "--rdzv_backend" not in launcher_command(take(LaunchSpec, alone), [])
    assert (
        launcher_environment(take(LaunchSpec, alone))["PET_STANDALONE"] == "1"
    )  # torchrun's --standalone
    assert launcher_environment(take(LaunchSpec, _config(tmp_path, nproc=2))) == {}


def test_a_range_of_machines_reaches_torchruns_elastic_agent(tmp_path: Path) -> None:
    """--nnodes MIN:MAX (with --max-restarts) goes to torchrun as its elastic range; what
    cannot take a range is refused, naming the flag."""
    from lmctl.config.slices import LaunchSpec, take
    from lmctl.run.launch import launcher_command

    elastic = {"nproc": 2, "master_addr": "10.0.0.1", "max_restarts": 2}
    config = _config(tmp_path, nnodes="1:3", **elastic)
    assert (config.nnodes, config.min_nnodes) == (3, 1)
    command = launcher_command(take(LaunchSpec, config), ["train", "clm"])
    assert command[command.index("--nnodes") + 1] == "1:3"
    assert "--rdzv_backend" in command and "--node_rank" not in command
    refused = {
        "MIN is above MAX": {**elastic, "nnodes": "3:2"},
        "needs --max-restarts N": {**elastic, "nnodes": "1:2", "max_restarts": 0},
        "--launcher accelerate has no range": {
            **elastic, "nnodes": "1:2", "launcher": "accelerate"
        },
        "continues on a fixed number of machines": {
            **elastic, "nnodes": "1:2", "output_dir": "s3://bucket/run"
        },
    }  # fmt: skip
    for message, values in refused.items():
        with pytest.raises(ConfigError) as caught:
            _config(tmp_path, **values)
        assert "--nnodes" in caught.value.message and message in caught.value.message
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, nproc=2, nnodes="one:2")
    assert "nnodes" in caught.value.message


def test_resume_on_another_world_size_keeps_the_global_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of 2 processes continues on 1 when the global batch stays the same
    (lmctl resume doubles the accumulation for it); a checkpoint that does not record its
    global batch, another global batch, a stream and sharded states are refused (exit 2)."""
    from lmctl.run.runtime import check_world_size
    from lmctl.run.totals import BatchShape

    checkpoint = tmp_path / "checkpoint-5"
    checkpoint.mkdir()
    for rank in (0, 1):
        (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"")
    (checkpoint / "trainer_state.json").write_text("{}")
    two = sliced(_config(tmp_path, per_device_train_batch_size=4))
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_world_size(checkpoint, two)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError) as caught:
        check_world_size(checkpoint, two)
    assert caught.value.exit_code == 2
    assert "saved by 2 process(es) and cannot continue on 1" in caught.value.message
    assert "does not record its global batch" in caught.value.message
    assert "resume it on 2" in (caught.value.hint or "")

    shape = BatchShape(4, 2, 1)
    holder = SimpleNamespace(stateful_callbacks=None)
    shape.record(holder)
    (checkpoint / "trainer_state.json").write_text(
        json.dumps({"stateful_callbacks": holder.stateful_callbacks})
    )
    assert BatchShape.of_checkpoint(checkpoint) == shape
    assert shape.on(1) == BatchShape(4, 1, 2) and shape.on(4) == BatchShape(2, 4, 1)
    assert shape.on(3) is None
    same = sliced(_config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2))
    check_world_size(checkpoint, same)
    with pytest.raises(ConfigError) as caught:
        check_world_size(checkpoint, two)
    assert "its global batch is 8 = 4 per device x 2 process(es)" in caught.value.message
    stream = sliced(
        _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                streaming=True, max_steps=10)
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        check_world_size(checkpoint, stream)
    assert "stream" in caught.value.message
    single = tmp_path / "checkpoint-9"
    single.mkdir()
    (single / "rng_state.pth").write_bytes(b"")
    check_world_size(single, two)

    # DeepSpeed ZeRO states: loaded from their universal conversion (trainer engine only).
    zero = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "deepspeed": "2"}
    with pytest.raises(ConfigError) as caught:
        check_world_size(checkpoint, sliced(_config(tmp_path, **zero)))
    assert "DeepSpeed ZeRO states are not converted for 1" in caught.value.message
    assert "lmctl resume RUN_DIR --nproc 1" in (caught.value.hint or "")
    (checkpoint / "global_step5_universal").mkdir()
    (checkpoint / "latest_universal").write_text("global_step5_universal")
    check_world_size(checkpoint, sliced(_config(tmp_path, **zero)))
    with pytest.raises(ConfigError) as caught:
        check_world_size(checkpoint, sliced(_config(tmp_path, **zero, engine="accelerate")))
    assert "the accelerate engine does not reshard DeepSpeed ZeRO states" in caught.value.message
