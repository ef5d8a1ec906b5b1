"""bfloat16 arrays as numpy holds them: uint16 bit patterns (the upper half of a float32).

Layers with ``precision: bf16`` store their weights and Adam moments this way;
:meth:`slide.Network.parameters` returns those arrays as uint16. :func:`to_float32` widens
them exactly; :func:`from_float32` rounds to nearest, ties to even, with the engine's rules
(zero and denormal inputs give a signed zero, NaNs stay quiet NaNs), so an array rounded here
equals what the engine would store.
"""
from __future__ import annotations

import numpy as np

__all__ = ["to_float32", "from_float32", "is_bf16"]


def is_bf16(a: np.ndarray) -> bool:
    """True for the uint16 arrays of bf16 layers."""
    return a.dtype == np.uint16


def to_float32(a: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exactly."""
    a = np.asarray(a)
    if a.dtype != np.uint16:
        raise TypeError(f"expected the uint16 bits of a bfloat16 array, got dtype {a.dtype}")
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_float32(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = u & np.uint32(0x7F800000)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    special = exponent == np.uint32(0x7F800000)
    nan = special & ((u & np.uint32(0x007FFFFF)) != 0)
    out = np.where(special, (u >> np.uint32(16)).astype(np.uint16), rounded)
    out = np.where(nan, out | np.uint16(0x0040), out)
    out = np.where(exponent == 0, ((u >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16), out)
    return out.astype(np.uint16)
