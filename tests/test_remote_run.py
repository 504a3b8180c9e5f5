"""Run directories on object storage (``--output-dir s3://...``, ``file://...``): written into
a local copy, each checkpoint uploaded when complete with its manifest last, the oldest
deleted in the store too, the finished run's files uploaded the same way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import S3Store, assert_clean_failure, lmctl, slow_except, tiny_clm_args

pytestmark = pytest.mark.e2e

MANIFEST = "lmctl-manifest.json"


class Store:
    """A remote run directory and a way to read every object under it."""

    def __init__(self, kind: str, tmp: Path, s3: S3Store | None) -> None:
        self.kind, self.s3 = kind, s3
        if kind == "s3":
            assert s3 is not None
            self.prefix = f"{tmp.name}/run"
            self.url = f"s3://{s3.bucket}/{self.prefix}"
        else:
            self.root = tmp / "store" / "run"
            self.url = f"file://{self.root}"

    def env(self, tmp: Path) -> dict[str, str]:
        base = {"LMCTL_CACHE": str(tmp / "cache")}
        return {**base, **(self.s3.env() if self.s3 is not None else {})}

    def objects(self) -> dict[str, bytes]:
        """Every object below the run directory, by its path relative to it; and whatever
        lies beside it (staging prefixes) under the key ``../NAME``."""
        if self.s3 is not None:
            parent = self.prefix.rsplit("/", 1)[0] + "/"
            keys = self.s3.keys(parent)
            return {self._rel(key[len(parent) :]): self.s3.read(key) for key in keys}
        parent = self.root.parent
        return {
            self._rel(path.relative_to(parent).as_posix()): path.read_bytes()
            for path in parent.rglob("*")
            if path.is_file()
        }

    @staticmethod
    def _rel(key: str) -> str:
        return key[len("run/") :] if key.startswith("run/") else f"../{key}"


@pytest.fixture(params=slow_except(["s3", "file"], "file"))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    s3 = request.getfixturevalue("s3_store") if request.param == "s3" else None
    return Store(request.param, tmp_path, s3)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _complete(objects: dict[str, bytes], folder: str) -> dict[str, bytes]:
    """The files of ``folder`` ('' for the run itself) that its manifest lists, each checked
    against its size and SHA-256 there."""
    prefix = f"{folder}/" if folder else ""
    manifest = json.loads(objects[f"{prefix}{MANIFEST}"])
    files = {}
    for item in manifest["files"]:
        data = objects[prefix + item["path"]]
        assert len(data) == item["size"] and _sha(data) == item["sha256"], item
        files[item["path"]] = data
    return files


def test_train_to_a_remote_run_directory(
    store: Store, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    args = tiny_clm_args(
        bpe_tokenizer, text_files, "-o", store.url, "--save-steps", "1", "--save-total-limit", "2"
    )
    proc = lmctl(*args, cwd=tmp_path, env=store.env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    staging = next((tmp_path / "cache" / "runs").iterdir())
    assert f"written to {staging} first" in proc.stderr
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())

    objects = store.objects()
    # Nothing is left beside the run or half-written in it.
    assert not [key for key in objects if key.startswith("../") or "lmctl-staging" in key]
    checkpoints = sorted({key.split("/")[0] for key in objects if key.startswith("checkpoint-")})
    assert checkpoints == ["checkpoint-3", "checkpoint-4"]
    for name in checkpoints:
        files = _complete(objects, name)
        local = staging / name
        assert sorted(files) == sorted(p.name for p in local.iterdir())
        assert all(files[rel] == (local / rel).read_bytes() for rel in files)
    run_files = _complete(objects, "")
    for name in (
        "config.json",
        "model.safetensors",
        "lmctl.yaml",
        "README.md",
        "loss.png",
        "all_results.json",
        "metrics.jsonl",
    ):
        assert run_files[name] == (staging / name).read_bytes(), name
    assert f"output_dir: {store.url}" in run_files["lmctl.yaml"].decode()

    # The same URL again: refused before any work, whether this machine has its copy or not.
    again = lmctl(*args, cwd=tmp_path, env=store.env(tmp_path))
    assert_clean_failure(again, 2, "holds an earlier run", "lmctl resume")
    fresh = {**store.env(tmp_path), "LMCTL_CACHE": str(tmp_path / "other-cache")}
    again = lmctl(*args, cwd=tmp_path, env=fresh)
    assert_clean_failure(again, 2, f"--output-dir {store.url} already holds a run")
    assert store.objects() == objects


def test_uploads_that_keep_failing_stop_the_run(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """A file where the first checkpoint's upload must go: tried again, then the run stops
    with exit code 6 and keeps its local copy."""
    store = Store("file", tmp_path, None)
    store.root.mkdir(parents=True)
    (store.root / ".checkpoint-1.lmctl-staging").write_text("in the way\n")
    env = {**store.env(tmp_path), "LMCTL_UPLOAD_ATTEMPTS": "2", "LMCTL_UPLOAD_BACKOFF": "0.1"}
    args = tiny_clm_args(bpe_tokenizer, text_files, "-o", store.url, "--save-steps", "1")
    proc = lmctl(*args, cwd=tmp_path, env=env)
    assert_clean_failure(proc, 6, "uploading checkpoint-1", "failed 2 times", "local copy")
    assert "trying again in 0.1 s (1 of 2)" in proc.stderr
    staging = next((tmp_path / "cache" / "runs").iterdir())
    assert (staging / "checkpoint-1" / "trainer_state.json").is_file()
    assert not (store.root / "checkpoint-1" / MANIFEST).exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("hf://user/run", "Hugging Face Hub cannot hold a run directory"),
        ("nosuchproto://bucket/run", "unknown storage protocol"),
        ("file://relative/run", "absolute path"),
    ],
    ids=["hf", "unknown", "relative-file"],
)
def test_unsupported_output_url_is_refused(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], url: str, needle: str
) -> None:
    proc = lmctl(*tiny_clm_args(bpe_tokenizer, text_files, "-o", url, steps=1), cwd=tmp_path)
    assert_clean_failure(proc, 2, f"--output-dir {url}", needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_killed_during_an_upload_then_resumed_from_the_bucket(
    s3_store: S3Store, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """SIGKILL while checkpoint-4 is being uploaded, the local copy deleted (a fresh machine):
    ``lmctl resume URL`` fetches checkpoint-2, the newest complete one, and ends with the
    weights of a run that was never interrupted. ``lmctl runs`` and ``lmctl eval`` read the
    run in the bucket."""
    import shutil
    import signal

    from safetensors.torch import load, load_file

    store = Store("s3", tmp_path, s3_store)
    extra = ("--max-steps", "6", "--save-steps", "2", "--no-eval")

    def args(out: str | Path) -> list[str | Path]:
        return tiny_clm_args(bpe_tokenizer, (text_files[0], None), "-o", out, *extra, steps=None)

    reference = tmp_path / "reference"
    proc = lmctl(*args(reference), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    # The run's files and checkpoint-2 take 34 writes (11 + 23), the run's files again 3
    # (those unchanged are not written again): the 40th is in checkpoint-4.
    killed = {**store.env(tmp_path), "LMCTL_TEST_PUSH_KILL_AFTER": "40"}
    proc = lmctl(*args(store.url), cwd=tmp_path, env=killed)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    objects = store.objects()
    assert f"checkpoint-2/{MANIFEST}" in objects
    assert f"checkpoint-4/{MANIFEST}" not in objects
    assert any(
        key.startswith("../.checkpoint-4.lmctl-staging/") or "staging" in key for key in objects
    )

    listed = lmctl("runs", store.url.rsplit("/", 1)[0], "--json", env=store.env(tmp_path))
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)["runs"]
    assert run["status"] == "interrupted at step 2", run
    assert run["resume_command"] == f"lmctl resume {store.url}"

    shutil.rmtree(tmp_path / "cache")  # nothing left on this machine
    proc = lmctl("resume", store.url, cwd=tmp_path, env=store.env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "fetched checkpoint-2" in proc.stderr

    objects = store.objects()
    assert not [key for key in objects if "lmctl-staging" in key], sorted(objects)
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-6"):
        _complete(objects, name)
    final = load(_complete(objects, "")["model.safetensors"])
    expected = load_file(str(reference / "model.safetensors"))
    assert final.keys() == expected.keys()
    assert max(float((final[k] - expected[k]).abs().max()) for k in final) < 1e-5

    listed = lmctl("runs", store.url, "--json", env=store.env(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["runs"][0]["status"] == "finished"
    evaluated = lmctl(
        "eval", store.url, "--validation-file", text_files[1], "--json", env=store.env(tmp_path)
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["metrics"]["eval_loss"] > 0


@pytest.mark.slow
def test_killed_during_training_then_resumed_from_a_file_url(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """SIGKILL between checkpoints, the local copy (--staging-dir) deleted: resumed into
    another local copy from the ``file://`` run directory, exactly."""
    import shutil
    import signal

    from tests.test_resume import _max_weight_diff, _run_until

    store = Store("file", tmp_path, None)
    extra = ("--max-steps", "8", "--save-steps", "3", "--no-eval", "--logging-steps", "1")

    reference = tmp_path / "reference"
    proc = lmctl(*tiny_clm_args(bpe_tokenizer, (text_files[0], None), "-o", reference, *extra,
                                steps=None), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    staging = tmp_path / "staging"
    killed_args = [
        str(arg)
        for arg in tiny_clm_args(bpe_tokenizer, (text_files[0], None), "-o", store.url, *extra,
                                 "--staging-dir", staging, steps=None)
    ]  # fmt: skip
    killed = _run_until(killed_args, staging, 7, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # checkpoint-6's upload may still have been under way: the newest complete one is used.
    complete = [n for n in (3, 6) if (store.root / f"checkpoint-{n}" / MANIFEST).is_file()]
    assert complete, sorted(p.name for p in store.root.iterdir())
    shutil.rmtree(staging)

    other = tmp_path / "other-staging"
    proc = lmctl("resume", store.url, "--staging-dir", other, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"fetched checkpoint-{complete[-1]}" in proc.stderr
    assert _max_weight_diff(reference, store.root) < 1e-5
    assert _max_weight_diff(reference, other) < 1e-5


def test_every_machine_keeps_its_own_local_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Machines that share a disk, or several 'machines' on one host, never write into one
    local copy; a run on one machine keeps the folder it always had."""
    from lmctl.storage.locations import run_staging_dir

    url = "s3://bucket/runs/clm-1"
    one, first, second = (
        run_staging_dir(url),
        run_staging_dir(url, 0, 2),
        run_staging_dir(url, 1, 2),
    )
    assert len({one, first, second}) == 3
    assert first.name == f"{one.name}-node0" and second.name == f"{one.name}-node1"


def test_machines_check_write_access_at_once(tmp_path: Path) -> None:
    """Every machine of a run checks write access to a file:// store as it starts: one's
    check removing the shared staging folder never fails another's."""
    from concurrent.futures import ThreadPoolExecutor

    from lmctl.console import Console, OutputOptions
    from lmctl.publish.stores import StoreTarget
    from lmctl.storage import locations

    location = locations.parse_location(f"file://{tmp_path}/store/run", "-o", destination=True)

    def checks(_: int) -> None:
        for _ in range(150):
            StoreTarget(location, Console(OutputOptions(quiet=True)), verbose=False).check_access()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(checks, range(2)))
    assert list((tmp_path / "store").iterdir()) == []


def test_files_another_process_staged_are_published_with_these(tmp_path: Path) -> None:
    """A machine's part of a checkpoint: staged and verified by its own process, moved into
    place by the one that publishes, listed in the manifest with the size and checksum it
    was staged with; a second publication after one that stopped midway finds it in place."""
    from lmctl.console import Console, OutputOptions
    from lmctl.publish.files import LocalFile
    from lmctl.publish.stores import StagedFile, StoreTarget
    from lmctl.storage import locations

    own, other = tmp_path / "own.bin", tmp_path / "other.bin"
    own.write_bytes(b"first machine\n")
    other.write_bytes(b"second machine\n")
    root = tmp_path / "store" / "checkpoint-5"
    target = StoreTarget(
        locations.parse_location(f"file://{root}", "--to", destination=True),
        Console(OutputOptions(quiet=True)),
        verbose=False,
    )
    fs, path = locations.open_location(target.location)
    staged = f"{target.staging_path(path)}/.lmctl-parts/node-1/rng_state_1.pth"
    fs.makedirs(staged.rsplit("/", 1)[0], exist_ok=True)
    fs.put_file(str(other), staged)
    part = StagedFile(
        "rng_state_1.pth", staged, other.stat().st_size, locations.file_digests(other)
    )
    files = [LocalFile("rng_state_0.pth", own, own.stat().st_size)]
    for _ in range(2):
        target.publish(files, (part,))
    assert (root / "rng_state_1.pth").read_bytes() == other.read_bytes()
    manifest = json.loads((root / MANIFEST).read_text())
    listed = {item["path"]: item["sha256"] for item in manifest["files"]}
    assert listed == {
        "rng_state_0.pth": _sha(own.read_bytes()),
        "rng_state_1.pth": _sha(other.read_bytes()),
    }
    assert not (tmp_path / "store" / ".checkpoint-5.lmctl-staging").exists()


def test_a_run_that_only_evaluates_uploads_its_results(
    tmp_path: Path, tiny_clm_run: Path, text_files: tuple[Path, Path]
) -> None:
    """No model of its own: its config and results still go up, with their manifest."""
    store = Store("file", tmp_path, None)
    args = ["train", "clm", "--model", tiny_clm_run, "--validation-file", text_files[1]]
    args += ["--no-train", "--block-size", "64", "-o", store.url]
    proc = lmctl(*args, env=store.env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    files = _complete(store.objects(), "")
    assert "eval_results.json" in files and "lmctl.yaml" in files
