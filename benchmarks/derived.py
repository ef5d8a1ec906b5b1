"""Real-data sets in regimes the 12 shared sets do not cover, derived from them.

``python benchmarks/suite.py --sets derived`` runs every system on these (``--sets words4k,...``
on some); the files are built once, deterministically, under ``$SLIDE_CACHE_DIR/derived``
(default ``~/.cache/slide/derived``). Each keeps its own test rows apart: only training rows
are subsampled, and nothing here is chosen on test scores.

* ``<set>-s<n>`` (``bibtex-s400``, ``corel5k-s600``, ``delicious-s1000``,
  ``stackex-chemistry-s500``, ``yahoo-arts-s800``, ``scene-s400``, ``yeast-s400``): ``n``
  training points of the set drawn at random (seed 0), its whole test file: tiny data with a
  few positives per label (bibtex-s400: about 6 a label); the last two tiny with dense
  real-valued features and few labels (6 and 14), the shape of a small audio or image set.
* ``words4k``: a text task shaped like a small EUR-Lex-4K (5,000 tf-idf features, 4,000
  labels, 1,053 training and 3,000 test points): the 6,000 rcv1subset2 documents (train and
  test files), whose labels are the words of document-frequency rank 1,500-5,500 present in
  the document and whose features are the tf-idf values of the other words of rank below
  9,000. About 13 labels a point, 3 positives a label: the regime where linear label vectors
  beat a network trained from scratch.
* ``densercv``: dense real-valued features of a text problem (120 truncated-SVD components of
  rcv1subset2's tf-idf rows, fitted on its training rows; its 101 labels), 2,000 training points of its training file, its
  test file: the shape of a small media set (120 dense features, 101 labels).
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import numpy as np
import scipy.sparse as sp

SUBSAMPLES = {"bibtex-s400": ("bibtex", 400), "corel5k-s600": ("corel5k", 600),
              "delicious-s1000": ("delicious", 1000), "stackex-chemistry-s500": ("stackex-chemistry", 500),
              "yahoo-arts-s800": ("yahoo-arts", 800), "scene-s400": ("scene", 400), "yeast-s400": ("yeast", 400)}
DERIVED = list(SUBSAMPLES) + ["words4k", "densercv"]


def root() -> Path:
    from slide.data import default_cache_dir

    return default_cache_dir() / "derived"


def paths(name: str, source_paths) -> Tuple[str, str]:
    """The train and test files of derived set ``name`` (built on first use); ``source_paths``
    maps a shared set's name to its (train, test) paths."""
    folder = root() / name
    train, test = folder / "train.txt", folder / "test.txt"
    if not (train.exists() and test.exists()):
        _build(name, source_paths, folder)
    return str(train), str(test)


def _save(path: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
    import slide

    slide.Dataset(X.astype(np.float32), Y.astype(np.float32)).save(path)   # atomic


def _build(name: str, source_paths, folder: Path) -> None:
    import slide

    folder.mkdir(parents=True, exist_ok=True)
    if name in SUBSAMPLES:
        src, n = SUBSAMPLES[name]
        tr_path, te_path = source_paths(src)
        tr, te = slide.load_dataset(tr_path), slide.load_dataset(te_path)
        rows = np.sort(np.random.default_rng(0).permutation(tr.features.shape[0])[:n])
        _save(folder / "test.txt", te.features.tocsr(), te.labels.tocsr())
        _save(folder / "train.txt", tr.features.tocsr()[rows], tr.labels.tocsr()[rows])
        return
    tr_path, te_path = source_paths("rcv1subset2")
    tr, te = slide.load_dataset(tr_path), slide.load_dataset(te_path)
    if name == "words4k":
        X = sp.vstack([tr.features, te.features]).tocsr()
        df = np.asarray((X > 0).sum(axis=0)).ravel()
        order = np.argsort(-df, kind="stable")
        feats = np.sort(np.concatenate([order[:1500], order[5500:9000]]))
        F, Y = X[:, feats].tocsr(), (X[:, order[1500:5500]] > 0).astype(np.float32).tocsr()
        keep = np.array([i for i in np.random.default_rng(0).permutation(X.shape[0])
                         if Y[i].nnz > 0 and F[i].nnz > 0])
        _save(folder / "test.txt", F[keep[1053:4053]], Y[keep[1053:4053]])
        _save(folder / "train.txt", F[keep[:1053]], Y[keep[:1053]])
    elif name == "densercv":
        from scipy.sparse.linalg import svds

        Xtr = tr.features.tocsr().astype(np.float64)
        _, _, vt = svds(Xtr, k=120, random_state=0)          # fitted on the training rows
        rows = np.sort(np.random.default_rng(0).permutation(Xtr.shape[0])[:2000])
        _save(folder / "test.txt", sp.csr_matrix(np.asarray(te.features.astype(np.float64) @ vt.T)),
              te.labels.tocsr())
        _save(folder / "train.txt", sp.csr_matrix(np.asarray(Xtr[rows] @ vt.T)), tr.labels.tocsr()[rows])
    else:
        raise ValueError(f"unknown derived set {name!r}; known: {', '.join(DERIVED)}")
