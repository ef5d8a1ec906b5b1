"""Reference systems that ``slide compare`` and ``benchmarks/`` measure slide against.

* :mod:`slide.baselines.torch_dense`: the same network as a slide config, trained densely by
  PyTorch (every output neuron, every sample), on the CPU or a CUDA device.
  Needs ``pip install slide[torch]``.
* :mod:`slide.baselines.pecos_linear`: PECOS XR-Linear (Yu et al., JMLR 2022), a strong
  hierarchical linear XMC method. Needs ``pip install slide[pecos]``.

Both modules import their heavy dependency lazily, so ``import slide.baselines`` always works;
constructing a trainer without the dependency raises :class:`ImportError` saying what to install.

This module holds what the baselines share: turning a data set into CSR matrices and scaling
its rows the way ``data.normalize`` tells slide to.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import scipy.sparse as sp

__all__ = ["as_csr_pair", "normalize_rows", "idf_weights"]


def as_csr_pair(data) -> Tuple[sp.csr_matrix, Optional[sp.csr_matrix]]:
    """``(features, labels)`` as CSR matrices from a :class:`slide.Dataset`, an object with
    ``.features``/``.labels``, a ``(features, labels)`` tuple or a bare feature matrix
    (labels ``None``). Features become float32 with sorted indices."""
    if hasattr(data, "features"):
        x, y = data.features, getattr(data, "labels", None)
    elif isinstance(data, tuple) and len(data) == 2:
        x, y = data
    else:
        x, y = data, None
    if not sp.issparse(x):
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"features must be a 2-D matrix, got an array of shape {x.shape}")
    x = sp.csr_matrix(x, dtype=np.float32)
    if not x.has_sorted_indices:
        x = x.copy()
        x.sort_indices()
    if y is not None:
        y = sp.csr_matrix(y)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"features have {x.shape[0]} rows but labels have {y.shape[0]}")
    return x, y


def idf_weights(features: sp.csr_matrix) -> np.ndarray:
    """Smoothed inverse document frequency per feature, ``log((1 + n) / (1 + df)) + 1``,
    computed on the training rows only (so test data never leaks into the scaling)."""
    n = features.shape[0]
    df = np.bincount(features.indices, minlength=features.shape[1]).astype(np.float64)
    return (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(np.float32)


def normalize_rows(features: sp.csr_matrix, mode: str = "l2",
                   idf: Optional[np.ndarray] = None) -> sp.csr_matrix:
    """Scale rows as ``data.normalize`` says: ``none``, ``l2`` (unit Euclidean norm) or
    ``tfidf_l2`` (multiply by ``idf``, then unit norm). All-zero rows stay zero.

    Returns a new float32 CSR matrix; the input is not modified.
    """
    if mode not in ("none", "l2", "tfidf_l2"):
        raise ValueError(f"data.normalize must be one of none, l2, tfidf_l2; got {mode!r}")
    x = sp.csr_matrix(features, dtype=np.float32, copy=True)
    if mode == "none":
        return x
    if mode == "tfidf_l2":
        if idf is None:
            raise ValueError("normalize_rows: mode 'tfidf_l2' needs the idf weights of the training rows")
        idf = np.asarray(idf, dtype=np.float32)
        if idf.shape[0] < x.shape[1]:
            raise ValueError(f"idf has {idf.shape[0]} weights for {x.shape[1]} features")
        x.data *= idf[x.indices]
    sq = np.asarray(x.multiply(x).sum(axis=1), dtype=np.float64).ravel()
    norms = np.sqrt(sq)
    norms[norms == 0.0] = 1.0
    x.data /= np.repeat(norms, np.diff(x.indptr)).astype(np.float32)
    return x
