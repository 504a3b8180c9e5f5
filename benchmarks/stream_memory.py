"""Peak memory of ``lmctl train clm --streaming`` does not grow with the corpus.

Generates a 1 GB and a 4 GB text file in a temporary directory, streams each through
``lmctl train clm --streaming --max-steps N`` (tiny GPT-2, held-out validation streamed from
the first 5% of the bytes and capped by --max-eval-samples) and prints the peak RSS of the
run (lmctl and its dataloader workers, sampled every 50 ms) for both and their ratio. A tool
that loaded the file would need gigabytes; streaming needs the same few hundred MB for both.

    nice python benchmarks/stream_memory.py [--sizes-gb 1 4] [--max-steps 50] [--workers 0]

Needs about 5 GB of free disk space in the temporary directory; everything is removed after.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    lmctl_env,
    run_lmctl,
    train_bpe_tokenizer,
    write_big_corpus,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-gb", type=float, nargs=2, default=[1.0, 4.0])
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--workers", type=int, default=0, help="--dataloader-num-workers")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lmctl-bench-"))
    try:
        tokenizer = train_bpe_tokenizer(work / "tok")
        env = lmctl_env(HF_HOME=str(work / "hf"), LMCTL_CACHE=str(work / "lmctl"))
        peaks = []
        for size in args.sizes_gb:
            corpus = write_big_corpus(work / "corpus.txt", size * 1024)
            command = [
                "train", "clm", "--model-type", "gpt2",
                "--config-overrides", "n_layer=2,n_embd=32,n_head=2,n_positions=128",
                "--tokenizer", tokenizer, "--train-file", corpus,
                "--streaming", "--max-steps", args.max_steps, "--block-size", "128",
                "--per-device-train-batch-size", "8", "--max-eval-samples", "64",
                "--dataloader-num-workers", args.workers, "--save-strategy", "no",
                "--overwrite-output-dir", "-o", work / "run",
            ]  # fmt: skip
            proc, wall, peak = run_lmctl(command, env, sample_memory=True)
            peaks.append(peak)
            shards = [line for line in proc.stderr.splitlines() if "train: streaming" in line]
            print(
                f"{corpus.stat().st_size / 2**30:.2f} GB corpus: peak RSS {peak / 2**20:.0f} MB "
                f"({wall:.0f} s; {shards[0].split('INFO', 1)[-1].strip() if shards else ''})"
            )
            corpus.unlink()
        growth = peaks[1] / peaks[0]
        print(f"peak RSS ratio ({args.sizes_gb[1]:g} GB / {args.sizes_gb[0]:g} GB): {growth:.3f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
