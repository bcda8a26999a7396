"""Array steps several families' preparations share, the same on either side (``xp``: NumPy or CuPy)."""

from __future__ import annotations

from typing import Any

import numpy as np


def stable_argsort(xp: Any, key: Any) -> Any:
    """The order that sorts ``key``, ties in their order (CuPy's argsort is always stable and takes no ``kind``)."""
    return np.argsort(key, kind="stable") if xp is np else key.argsort()
