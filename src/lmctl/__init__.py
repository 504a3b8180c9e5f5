"""lmctl: train, fine-tune, evaluate, resume and publish transformer language models."""

__version__ = "0.1.0"

#: The name pip installs this project under. The command and the import package are
#: ``lmctl``, but that name on the package index belongs to an unrelated project, so every
#: install hint and the model card's link name this one instead.
DISTRIBUTION = "lmctl-train"
#: The project's page on the package index, linked from every model card.
HOME = f"https://pypi.org/project/{DISTRIBUTION}/"


def install_hint(extra: str) -> str:
    """The command that installs one optional extra, so no hint names another project."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
