"""Engines: the programs a run's job executes, one folder each, behind the Engine protocol (base.py).

Adding an engine is a new folder ``kit/engines/<name>/`` whose ``__init__`` defines ``ENGINE`` (see
``smoke/``), its traits in :mod:`kit.model.engine_traits`, and one line in ``_REGISTERED`` below.
Example::

    get_engine("smoke").traits.platform       # 'cpu'
    get_engine(arm.engine).command(...)       # the job's command line
"""

from __future__ import annotations

from kit.engines.base import Engine
from kit.engines.gpu import ENGINE as _GPU
from kit.engines.smoke import ENGINE as _SMOKE
from kit.engines.vime.engine import ENGINE as _VIME
from kit.model.errors import BadInput

_REGISTERED: tuple[Engine, ...] = (
    _SMOKE,
    _VIME,
    _GPU,
)
ENGINES: dict[str, Engine] = {e.traits.name: e for e in _REGISTERED}


def get_engine(name: str) -> Engine:
    """The registered engine of that name; BadInput naming the accepted ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise BadInput(f"engine {name!r}: accepted {', '.join(sorted(ENGINES))}") from None
