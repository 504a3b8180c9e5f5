"""Files shipped inside the package.

Bottom layer: imports nothing else of lmctl.
"""

from pathlib import Path

#: Public-domain Shakespeare (see corpus/NOTICE.txt) for the embedded default run.
EMBEDDED_CORPUS = Path(__file__).parent / "corpus" / "shakespeare.txt"

#: DeepSpeed configs for ``--deepspeed 1|2|3`` (and ZeRO-3 with CPU offload), with ``auto``
#: values that the engines fill from the run's own settings.
DEEPSPEED_CONFIGS = Path(__file__).parent / "deepspeed"


def deepspeed_config(stage: str) -> Path:
    """The shipped config of ZeRO stage ``stage`` ("1", "2" or "3")."""
    return DEEPSPEED_CONFIGS / f"zero{stage}.json"
