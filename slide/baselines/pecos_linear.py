"""PECOS XR-Linear baseline: a hierarchical linear XMC model on the same input rows.

XR-Linear (Yu, Zhong, Zhang, Chang, Zhang, Dhillon, "PECOS: Prediction for Enormous and
Correlated Output Spaces", JMLR 2022) clusters the labels into a tree by hierarchical k-means of
their PIFA embeddings (the mean of the scaled feature rows of the points carrying each label),
trains one sparse linear one-vs-rest ranker per tree level with negatives from the matcher (TFN),
and predicts by beam search down the tree. It is a strong, fast CPU baseline on the classic XMC
sets; it is not a neural network, so it answers "how good is a linear model" rather than "how
fast is the same network".

Inputs are scaled as ``data.normalize`` says (L2 rows by default), exactly as slide sees them.
``libpecos`` is optional (``pip install slide[pecos]``) and imported when a model is built.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import scipy.sparse as sp

from ..config import Config
from . import as_csr_pair, evaluate_topk, idf_weights, scale_rows, standardization_for, threads_for

__all__ = ["PecosXLinear", "import_pecos"]

_INSTALL_HINT = ("the PECOS baseline needs libpecos: install it with `pip install slide[pecos]` "
                 "(or `pip install libpecos`)")


def import_pecos():
    """Import the PECOS XR-Linear modules, or raise ImportError saying how to install them."""
    try:
        from pecos.xmc import Indexer, LabelEmbeddingFactory
        from pecos.xmc.xlinear.model import XLinearModel
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from None
    return XLinearModel, Indexer, LabelEmbeddingFactory


class PecosXLinear:
    """Train and query an XR-Linear model.

    ``nr_splits`` is the tree's branching factor, ``beam_size`` the beam of the search at
    prediction, ``threshold`` drops small ranker weights (sparser, faster model), ``Cp``/``Cn``
    the SVM costs of positives/negatives. Threads come from ``training.threads`` (0 = all cores).
    """

    def __init__(self, config=None, *, nr_splits: int = 16, beam_size: int = 10,
                 threshold: float = 0.1, Cp: float = 1.0, Cn: float = 1.0,
                 solver_type: str = "L2R_L2LOSS_SVC_DUAL"):
        self._XLinearModel, self._Indexer, self._LabelEmbeddingFactory = import_pecos()
        self.config = Config.load(config)
        if nr_splits < 2:
            raise ValueError(f"nr_splits must be >= 2, got {nr_splits}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        self.nr_splits = int(nr_splits)
        self.beam_size = int(beam_size)
        self.threshold = float(threshold)
        self.Cp, self.Cn = float(Cp), float(Cn)
        self.solver_type = solver_type
        self.threads = threads_for(self.config)
        self.model = None
        self.num_features: Optional[int] = None
        self.num_labels: Optional[int] = None
        self._idf: Optional[np.ndarray] = None
        self._standard = None   # data.standardize: (mean, scale) of the training features

    def _prepare(self, x: sp.csr_matrix) -> sp.csr_matrix:
        return scale_rows(x, self.num_features, self.config.data.normalize, self._idf, self._standard)

    def fit(self, train) -> "PecosXLinear":
        """Train on a :class:`slide.Dataset` (or ``(features, labels)``). Points with no label
        are kept (they are negatives for every ranker)."""
        x, y = as_csr_pair(train)
        if y is None:
            raise ValueError("fit needs training labels")
        if y.nnz == 0:
            raise ValueError("no training point has a label")
        self.num_features = x.shape[1]
        self.num_labels = y.shape[1]
        if self.config.data.normalize == "tfidf_l2":
            self._idf = idf_weights(x)
        self._standard = standardization_for(self.config, x)
        X = self._prepare(x)
        Y = sp.csr_matrix((np.ones(y.nnz, dtype=np.float32), y.indices, y.indptr), shape=y.shape)
        label_feat = self._LabelEmbeddingFactory.create(Y, X, method="pifa")
        chain = self._Indexer.gen(label_feat, indexer_type="hierarchicalkmeans",
                                  nr_splits=self.nr_splits, seed=self.config.training.seed,
                                  threads=self.threads)
        self.model = self._XLinearModel.train(
            X, Y, C=chain, threads=self.threads, threshold=self.threshold, Cp=self.Cp, Cn=self.Cn,
            solver_type=self.solver_type)
        return self

    def predict_topk(self, X, k: int = 5):
        """``(labels int32 [n, k], scores float32 [n, k])``, best first; rows with fewer than
        ``k`` candidates in the beam are padded with label ``-1`` and score ``0``."""
        if self.model is None:
            raise RuntimeError("predict_topk: the model is not trained (call fit first)")
        k = int(k)
        if not 1 <= k <= self.num_labels:
            raise ValueError(f"k must be in [1, {self.num_labels}], got {k}")
        x, _ = as_csr_pair(X)
        P = sp.csr_matrix(self.model.predict(self._prepare(x), only_topk=k,
                                             beam_size=max(self.beam_size, 1), threads=self.threads))
        n = P.shape[0]
        labels = np.full((n, k), -1, dtype=np.int32)
        scores = np.zeros((n, k), dtype=np.float32)
        for i in range(n):
            a, b = P.indptr[i], P.indptr[i + 1]
            if a == b:
                continue
            order = np.argsort(-P.data[a:b], kind="stable")[:k]
            labels[i, :order.size] = P.indices[a:b][order]
            scores[i, :order.size] = P.data[a:b][order]
        return labels, scores

    def evaluate(self, data, k=(1, 3, 5)) -> Dict[str, float]:
        """:func:`slide.metrics.evaluate` of the top-``max(k)`` predictions on ``data``."""
        return evaluate_topk(self, data, k)

    def params_summary(self) -> Dict[str, Any]:
        return {"nr_splits": self.nr_splits, "beam_size": self.beam_size, "threshold": self.threshold,
                "Cp": self.Cp, "Cn": self.Cn, "solver_type": self.solver_type,
                "normalize": self.config.data.normalize}
