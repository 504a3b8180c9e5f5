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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lmctl.resources import EMBEDDED_CORPUS

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep Hugging Face caches of the test run away from the user's."""
    home = tmp_path_factory.mktemp("hf-home")
    os.environ["HF_HOME"] = str(home)
    os.environ["HF_DATASETS_CACHE"] = str(home / "datasets")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


TINY_GPT2 = ("--model-type", "gpt2", "--config-overrides", "n_layer=2,n_embd=64,n_head=2")


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
