"""The training objectives, by name. Modules are imported only when a command needs one.

May import data, models, config, storage and the bottom layer.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmctl.objectives.base import Objective

#: name -> module defining ``OBJECTIVE``. Adding an objective is one module and one line here.
OBJECTIVES: dict[str, str] = {
    "clm": "lmctl.objectives.clm",
    "mlm": "lmctl.objectives.mlm",
    "plm": "lmctl.objectives.plm",
    "swag": "lmctl.objectives.swag",
}


def get_objective(name: str) -> Objective:
    objective: Objective = import_module(OBJECTIVES[name]).OBJECTIVE
    return objective
