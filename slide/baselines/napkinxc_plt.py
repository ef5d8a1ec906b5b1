"""napkinXC PLT baseline: a probabilistic label tree of linear node classifiers on the same rows.

A probabilistic label tree (Jasinska, Dembczynski, Busa-Fekete, Pfannschmidt, Klerx, Hüllermeier,
"Extreme F-measure maximization using sparse probability estimates", ICML 2016; Jasinska-Kobus,
Wydmuch, Dembczynski, Kuznetsov, Busa-Fekete, "Probabilistic label trees for extreme multi-label
classification", 2020) arranges the labels in a tree (napkinXC builds it by balanced hierarchical
2-means on label centroids) and trains, at each node, a sparse logistic regression for "some label
below this node is relevant" given that the parent's is. A label's probability is the product of
the node probabilities on its path; top-k prediction searches the tree for the most probable leaves.

The model is napkinXC's ``PLT`` with the library's own defaults (its recommended settings), a
fixed seed (``training.seed``) and ``training.threads`` threads (0 = all cores). Rows are scaled by
:func:`slide.scaling.normalize_rows` as ``data.normalize`` says, the code slide itself uses.
napkinXC then scales every row to unit norm once more (its default ``norm``; napkinxc 0.7.2
crashes with it off): with the default ``l2`` rows that changes values by rounding at most, but
with ``data.normalize: none`` napkinXC still sees unit rows.
Prediction runs in chunks of rows, and :meth:`NapkinPLT.evaluate` scores with :mod:`slide.metrics`.

``napkinxc`` is optional (``pip install slide[napkinxc]``) and imported when a model is built.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ..config import Config
from . import as_csr_pair, evaluate_topk, idf_weights, scale_rows, standardization_for, threads_for

__all__ = ["NapkinPLT", "import_napkinxc"]

_INSTALL_HINT = ("the napkinXC baseline needs napkinxc: install it with `pip install slide[napkinxc]` "
                 "(or `pip install napkinxc`)")


def import_napkinxc():
    """The napkinXC ``PLT`` class, or ImportError saying how to install it."""
    try:
        from napkinxc.models import PLT
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from None
    return PLT


class NapkinPLT:
    """Train and query a napkinXC probabilistic label tree.

    ``chunk_rows`` rows are predicted per call into napkinXC (bounding the Python lists it
    returns). ``plt_params`` go to ``napkinxc.models.PLT`` unchanged (e.g. ``arity``,
    ``max_leaves``, ``liblinear_c``); left out, napkinXC's defaults apply. The model files live
    in a temporary folder that is removed with the object (or by :meth:`close`).

    Not thread-safe: one thread at a time may call a method of one object.
    """

    def __init__(self, config=None, *, chunk_rows: int = 10_000, **plt_params: Any):
        self._PLT = import_napkinxc()
        self.config = Config.load(config)
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        for reserved in ("output", "seed", "threads"):
            if reserved in plt_params:
                raise ValueError(f"{reserved!r} is set by NapkinPLT (from the configuration); "
                                 f"do not pass it in plt_params")
        if "norm" in plt_params and not plt_params["norm"]:
            # napkinxc 0.7.2 dies with a segmentation fault in fit when its row norm is off
            raise ValueError("norm=False is refused: napkinxc crashes in fit without its row norm "
                             "(rows already have slide's scaling; the extra unit norm keeps them)")
        self.chunk_rows = int(chunk_rows)
        self.plt_params = dict(plt_params)
        self.threads = threads_for(self.config)
        self.model = None
        self.num_features: Optional[int] = None
        self.num_labels: Optional[int] = None
        self.train_seconds: Optional[float] = None
        self._idf: Optional[np.ndarray] = None
        self._standard = None   # data.standardize: (mean, scale) of the training features
        self._dir: Optional[str] = None
        self._cleanup = None

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Drop the model and delete its files."""
        self.model = None
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None
        self._dir = None

    def __enter__(self) -> "NapkinPLT":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # ------------------------------------------------------------------ training
    def _prepare(self, x: sp.csr_matrix) -> sp.csr_matrix:
        return scale_rows(x, self.num_features, self.config.data.normalize, self._idf, self._standard)

    def fit(self, train) -> "NapkinPLT":
        """Train on a :class:`slide.Dataset` (or ``(features, labels)``). Points with no label
        are kept (they are negatives for every node). ``train_seconds`` is the time of napkinXC's
        training call alone (row scaling and conversions excluded)."""
        x, y = as_csr_pair(train)
        if y is None:
            raise ValueError("fit needs training labels")
        if y.nnz == 0:
            raise ValueError("no training point has a label")
        self.close()
        self.num_features = x.shape[1]
        self.num_labels = y.shape[1]
        self._idf = idf_weights(x) if self.config.data.normalize == "tfidf_l2" else None
        self._standard = standardization_for(self.config, x)
        X = self._prepare(x)
        Y = sp.csr_matrix((np.ones(y.nnz, dtype=np.float32), y.indices, y.indptr), shape=y.shape)
        self._dir = tempfile.mkdtemp(prefix="slide-napkinxc-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        model = self._PLT(os.path.join(self._dir, "model"), seed=int(self.config.training.seed),
                          threads=self.threads, **self.plt_params)
        t0 = time.perf_counter()
        model.fit(X, Y)
        self.train_seconds = time.perf_counter() - t0
        self.model = model
        return self

    # ------------------------------------------------------------------ prediction
    def predict_topk(self, X, k: int = 5) -> Tuple[np.ndarray, np.ndarray]:
        """``(labels int32 [n, k], probabilities float32 [n, k])``, most probable first; rows with
        fewer than ``k`` candidates are padded with label ``-1`` and probability ``0``."""
        if self.model is None:
            raise RuntimeError("predict_topk: the model is not trained (call fit first)")
        k = int(k)
        if not 1 <= k <= self.num_labels:
            raise ValueError(f"k must be in [1, {self.num_labels}], got {k}")
        x, _ = as_csr_pair(X)
        x = self._prepare(x)
        n = x.shape[0]
        labels = np.full((n, k), -1, dtype=np.int32)
        scores = np.zeros((n, k), dtype=np.float32)
        for lo in range(0, n, self.chunk_rows):
            hi = min(n, lo + self.chunk_rows)
            for i, row in enumerate(self.model.predict_proba(x[lo:hi], top_k=k), start=lo):
                # napkinXC returns each row best first; ties keep its order
                row = sorted(row, key=lambda p: -p[1])[:k]
                if row:
                    labels[i, :len(row)] = [int(label) for label, _ in row]
                    scores[i, :len(row)] = [float(p) for _, p in row]
        return labels, scores

    def evaluate(self, data, k: Sequence[int] = (1, 3, 5),
                 propensities: Optional[np.ndarray] = None) -> Dict[str, float]:
        """:func:`slide.metrics.evaluate` of the top-``max(k)`` predictions on ``data``."""
        return evaluate_topk(self, data, k, propensities)

    def params_summary(self) -> Dict[str, Any]:
        """The settings that differ from napkinXC's defaults, and the model's size on disk."""
        out: Dict[str, Any] = {"model": "napkinxc.PLT", "seed": int(self.config.training.seed),
                               "threads": self.threads, "normalize": self.config.data.normalize}
        out.update(self.plt_params)
        if self._dir is not None and os.path.isdir(self._dir):
            out["model_bytes"] = sum(os.path.getsize(os.path.join(root, f))
                                     for root, _, files in os.walk(self._dir) for f in files)
        return out
