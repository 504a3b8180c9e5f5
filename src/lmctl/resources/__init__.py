"""Files shipped inside the package.

Bottom layer: imports nothing else of lmctl.
"""

from pathlib import Path

#: Public-domain Shakespeare (see corpus/NOTICE.txt) for the embedded default run.
EMBEDDED_CORPUS = Path(__file__).parent / "corpus" / "shakespeare.txt"
