"""Preprocessing time of a second identical ``lmctl train`` run, against the first.

Two identical ``lmctl train clm`` runs (tiny model, one step) on a generated 32 MB text file
with fresh Hugging Face and lmctl caches. Preprocessing time is what lmctl logs as
"data ready in N s": loading the raw data and tokenizing/grouping it (a cache lookup on the
second run). The second run should spend under 5% of the first run's time.

    python benchmarks/cache_reuse.py [--size-mb 32]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import lmctl_env, run_lmctl, train_bpe_tokenizer, write_corpus

DATA_READY = re.compile(r"data ready in ([0-9.]+) s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=32)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lmctl-bench-"))
    try:
        corpus = write_corpus(work / "corpus.txt", args.size_mb)
        tokenizer = train_bpe_tokenizer(work / "tok")
        env = lmctl_env(
            HF_HOME=str(work / "hf"),
            HF_DATASETS_CACHE=str(work / "hf" / "datasets"),
            LMCTL_CACHE=str(work / "lmctl"),
        )
        command = [
            "train", "clm", "--model-type", "gpt2",
            "--config-overrides", "n_layer=2,n_embd=32,n_head=2,n_positions=256",
            "--tokenizer", tokenizer, "--train-file", corpus, "--block-size", "256",
            "--max-steps", "1", "--no-eval", "--save-strategy", "no",
            "--overwrite-output-dir", "-o", work / "run",
        ]  # fmt: skip
        seconds = []
        for attempt in ("first", "second"):
            proc, wall, _ = run_lmctl(command, env)
            found = DATA_READY.findall(proc.stderr)
            if not found:
                raise SystemExit("no 'data ready' line in lmctl's log")
            reused = "reusing prepared data" in proc.stderr
            seconds.append(float(found[-1]))
            print(
                f"{attempt} run: preprocessing {seconds[-1]:.2f} s "
                f"(whole run {wall:.1f} s, prepared cache reused: {reused})"
            )
        print(f"corpus: {corpus.stat().st_size / 2**20:.1f} MB")
        print(f"cache ratio (second / first preprocessing time): {seconds[1] / seconds[0]:.2%}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
