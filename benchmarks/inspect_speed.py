"""``lmctl data inspect clm`` on a large corpus answers in seconds: it reads a sample.

Writes a text file of about 1 GB whose lines are all different (the shipped corpus, every
line numbered) in a temporary folder, trains a small byte-level BPE tokenizer with
``tokenizers``, and times

    lmctl data inspect clm --train-file BIG --tokenizer-name TOK

with the default ``--sample`` (the whole process: start-up, imports, reading, tokenizing and
the report). The target is under 30 s on a 2-core machine.

    python benchmarks/inspect_speed.py [--size-mb 1024] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import lmctl_env, run_lmctl, train_bpe_tokenizer, write_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=1024.0)
    parser.add_argument("--keep", type=Path, help="keep the corpus and tokenizer here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="lmctl-inspect-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        big = folder / "big.txt"
        if not big.is_file() or big.stat().st_size < args.size_mb * (1 << 20) * 0.99:
            write_corpus(big, args.size_mb, distinct=True)
        tokenizer = folder / "tokenizer"
        if not (tokenizer / "tokenizer.json").is_file():
            train_bpe_tokenizer(tokenizer)
        done, seconds, _ = run_lmctl(
            ["data", "inspect", "clm", "--train-file", big, "--tokenizer-name", tokenizer,
             "--json"],
            lmctl_env(),
        )  # fmt: skip
        result = json.loads(done.stdout)
        train = result["splits"]["train"]
        print(f"corpus: {big.stat().st_size / (1 << 20):.0f} MB; {train['read']}")
        print(f"lmctl data inspect clm: {seconds:.2f} s (target < 30 s)")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
