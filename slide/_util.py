"""Small helpers shared across the package: JSON conversion, peak memory, byte sizes, integer checks."""
from __future__ import annotations

import math
import sys
from typing import Any, Optional, Tuple

import numpy as np

__all__ = ["jsonable", "peak_rss_bytes", "format_bytes", "positive_int"]


def clear_gain(hits: np.ndarray, base_hits: np.ndarray) -> Tuple[bool, int, int]:
    """Whether ``hits`` (per validation row: whether an option ranks it right at P@1, or at P@k
    how many true labels its top k holds) beat ``base_hits`` (the default's) by one standard error
    of the paired difference d = hits - base_hits: b = the sum of the positive d, c = that of the
    negative ones, b - c >= max(1, sqrt(sum d^2)). At P@1 that is right on b rows where the
    default is wrong, wrong on c where it is right, b - c >= max(1, sqrt(b + c)). Returns
    (clear, b, c). Choosing by one validation point more switches on noise; the split-half
    checks of slide.centroids.choose and slide.lr_search measured this rule against that one."""
    d = np.asarray(hits).astype(np.int64) - np.asarray(base_hits).astype(np.int64)
    b, c = int(d[d > 0].sum()), int(-d[d < 0].sum())
    return b - c >= max(1.0, math.sqrt(float(np.dot(d, d)))), b, c


def jsonable(obj: Any, nonfinite_as_none: bool = True) -> Any:
    """``obj`` with numpy scalars and arrays turned into Python numbers and lists, tuples into
    lists and dict keys into strings, so that :func:`json.dumps` accepts it.

    With ``nonfinite_as_none`` (the default) NaN and infinite floats become ``None``, which is
    strict JSON; without it they stay floats (Python's ``json`` round-trips them as
    ``NaN``/``Infinity``), for files that only this package reads back.
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v, nonfinite_as_none) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, nonfinite_as_none) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), nonfinite_as_none)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if nonfinite_as_none and isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far, in bytes.

    On Linux this is the high-water mark of the process's own memory (``VmHWM``); the
    ``ru_maxrss`` of :func:`resource.getrusage`, used elsewhere, also counts the parent's
    memory at the moment a subprocess was started (it survives ``exec``), so a small worker
    started by a large process would report the parent's size.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes.
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))


def format_bytes(n: Optional[float]) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units up to TiB); ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} TiB"


def positive_int(v, name: str, allow_zero: bool = False) -> int:
    """``v`` as an int, or ValueError naming ``name`` when it is not a positive (or, with
    ``allow_zero``, non-negative) integer."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, "
                         f"got {v!r}")
    return int(v)
