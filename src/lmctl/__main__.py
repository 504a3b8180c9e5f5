"""``python -m lmctl`` (also what ``accelerate launch -m lmctl`` and ``torchrun -m lmctl`` run)."""

from lmctl.cli.app import main

if __name__ == "__main__":
    main()
