"""Reference systems that ``slide compare`` and ``benchmarks/`` measure slide against.

* :mod:`slide.baselines.torch_dense`: the same network as a slide config, trained densely by
  PyTorch (every output neuron, every sample), on the CPU or a CUDA device.
  Needs ``pip install slide[torch]``.
* :mod:`slide.baselines.pecos_linear`: PECOS XR-Linear (Yu et al., JMLR 2022), a strong
  hierarchical linear XMC method. Needs ``pip install slide[pecos]``.
* :mod:`slide.baselines.napkinxc_plt`: napkinXC's probabilistic label tree (Jasinska-Kobus et al.),
  a fast tree of linear node classifiers. Needs ``pip install slide[napkinxc]``.
* :mod:`slide.baselines.compare`: the harness behind ``slide compare`` that trains slide and one
  of these on the same data and measures both the same way.

The baseline modules import their heavy dependency lazily, so ``import slide.baselines`` always works;
constructing a trainer without the dependency raises :class:`ImportError` saying what to install.

This module holds what the baselines share: turning a data set into CSR matrices, and (from
:mod:`slide.scaling`, the code slide itself uses) scaling its rows as ``data.normalize`` says.
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ..scaling import feature_standardization, idf_weights, normalize_rows, standardize, wants_standardize

__all__ = ["as_csr_pair", "normalize_rows", "idf_weights", "scale_rows", "standardization_for", "threads_for",
           "evaluate_topk"]


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


def standardization_for(config, features: sp.csr_matrix, num_features: Optional[int] = None):
    """The ``(mean, scale)`` per feature (``num_features`` wide, at least the matrix's width) that
    ``data.standardize`` asks for on these training features, as :class:`slide.Network` computes
    them, or None: every system sees the same input."""
    if not wants_standardize(config.data.standardize, features):
        return None
    return feature_standardization(features, num_features)


def scale_rows(features: sp.csr_matrix, num_features: int, mode: str,
               idf: Optional[np.ndarray] = None, standard=None) -> sp.csr_matrix:
    """Rows of a model trained on ``num_features`` features, standardized with ``standard``
    (``(mean, scale)`` or None) and scaled as ``data.normalize`` (``mode``) says. A matrix with
    fewer columns is widened (its features are the first ones); one with more raises ValueError."""
    if features.shape[1] < num_features:
        features = sp.csr_matrix((features.data, features.indices, features.indptr),
                                 shape=(features.shape[0], num_features))
    elif features.shape[1] > num_features:
        raise ValueError(f"data has {features.shape[1]} features, the model was trained on {num_features}")
    if standard is not None:
        features = standardize(features, *standard)
    return normalize_rows(features, mode, idf)


def threads_for(config) -> int:
    """``training.threads`` of a configuration, or every CPU this process may use when it is 0."""
    if config.training.threads > 0:
        return int(config.training.threads)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def evaluate_topk(model, data, k: Sequence[int] = (1, 3, 5),
                  propensities: Optional[np.ndarray] = None) -> Dict[str, float]:
    """:func:`slide.metrics.evaluate` of ``model.predict_topk(features, max(k))`` on ``data``
    (anything :func:`as_csr_pair` accepts, with labels): every baseline is scored by slide's code."""
    from ..metrics import evaluate

    x, y = as_csr_pair(data)
    if y is None:
        raise ValueError("evaluate needs labels")
    top, _ = model.predict_topk(x, max(k))
    return {key: float(v) for key, v in evaluate(top, y, k=tuple(k), propensities=propensities).items()}
