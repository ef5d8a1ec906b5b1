"""Synthetic extreme-classification data with the shapes of public benchmarks.

Amazon-670K and Delicious-200K cannot be downloaded everywhere; the generator produces data of
the same size and sparsity so that speed, memory and scaling can be measured anywhere, and that a
model can really learn, so accuracy curves mean something.

Model of the data (all draws from generators derived from one seed, fully vectorised):

* Label frequencies follow a power law: the label of frequency rank ``r`` has weight
  ``r^-power_law_exponent`` (Zipf); ranks are shuffled over label ids.
* Labels are grouped into ``topics`` (about ``sqrt(L)`` of them). A point picks one topic with
  probability proportional to the topic's total weight, then draws its labels (``1 + Poisson``,
  mean ``avg_labels``), each from its topic with probability ``topic_mix`` and from all labels
  otherwise. This gives label co-occurrence (and low-rank structure) like real tag data.
* Every label owns ``prototypes`` feature ids: a share ``topic_share`` from its topic's part of
  the vocabulary, the rest anywhere. For each of its labels a point shows a random window of the
  label's prototypes; it also shows the prototypes of about ``distractors`` times as many labels
  it does not carry (a document mentions subjects it is not tagged with), so that no classifier
  is perfect. Background words drawn from a Zipf distribution over all features fill the rest:
  ``signal`` is the share of non-zeros that are prototype evidence. Features are thus
  informative about labels but noisy, and rare labels have few training examples.
* Values are tf-idf-like: ``(1 + ln tf) * idf`` with ``idf`` from training-set document
  frequencies, rows scaled to unit L2 norm, float32.

Points are generated in fixed-size chunks, each with its own child seed, so the result depends
only on the seed and the shape, never on memory or thread settings.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Dict, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from .._io import atomic_write_text
from ..scaling import idf_weights, normalize_rows

__all__ = ["SyntheticSpec", "PRESETS", "make_synthetic", "make_synthetic_arrays", "write_synthetic"]

# Fixed: the data must not depend on it (see the module docstring).
_CHUNK = 32768
# term counts of one draw are at most this (they share an int64 with the point and feature id)
_TF_MAX = 15


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape and structure of a synthetic data set (see the module docstring for the model)."""

    num_features: int
    num_labels: int
    num_train: int
    num_test: int
    avg_labels: float
    avg_nnz: float
    power_law_exponent: float = 1.0
    feature_exponent: float = 1.0
    signal: float = 0.6
    topics: int = 0
    topic_mix: float = 0.8
    prototypes: int = 0
    topic_share: float = 0.75
    distractors: float = 1.0
    description: str = ""

    def validate(self) -> None:
        def err(name, msg):
            raise ValueError(f"synthetic data: {name}: {msg}")
        for name in ("num_features", "num_labels", "num_train"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                err(name, f"must be a positive integer, got {v!r}")
        if not isinstance(self.num_test, (int, np.integer)) or self.num_test < 0:
            err("num_test", f"must be a non-negative integer, got {self.num_test!r}")
        if not 1.0 <= self.avg_labels <= self.num_labels:
            err("avg_labels", f"must be in [1, num_labels={self.num_labels}], got {self.avg_labels}")
        if not 1.0 <= self.avg_nnz <= self.num_features:
            err("avg_nnz", f"must be in [1, num_features={self.num_features}], got {self.avg_nnz}")
        if not self.power_law_exponent >= 0:
            err("power_law_exponent", f"must be >= 0, got {self.power_law_exponent}")
        if not self.feature_exponent >= 0:
            err("feature_exponent", f"must be >= 0, got {self.feature_exponent}")
        if not 0.0 <= self.signal <= 1.0:
            err("signal", f"must be in [0, 1], got {self.signal}")
        if not 0.0 <= self.topic_mix <= 1.0:
            err("topic_mix", f"must be in [0, 1], got {self.topic_mix}")
        if self.topics < 0 or self.topics > self.num_labels:
            err("topics", f"must be in [0, num_labels], 0 = about sqrt(num_labels), got {self.topics}")
        if not 0.0 <= self.topic_share <= 1.0:
            err("topic_share", f"must be in [0, 1], got {self.topic_share}")
        if not 0.0 <= self.distractors <= 10.0:
            err("distractors", f"must be in [0, 10], got {self.distractors}")
        if self.prototypes < 0:
            err("prototypes", f"must be >= 0 (0 = derived), got {self.prototypes}")

    # derived sizes
    @property
    def num_topics(self) -> int:
        return self.topics or max(1, int(round(math.sqrt(self.num_labels))))

    @property
    def signal_per_label(self) -> float:
        """Expected prototype features a point shows per label it carries."""
        return self.signal * self.avg_nnz / self.avg_labels

    @property
    def num_prototypes(self) -> int:
        if self.prototypes:
            return self.prototypes
        # a point shows about half of a label's prototypes, so that different points of a label
        # share some but not all of its evidence
        return int(min(self.num_features, max(2, math.ceil(2 * self.signal_per_label))))


PRESETS: Dict[str, SyntheticSpec] = {
    "amazon-670k": SyntheticSpec(
        num_features=135_909, num_labels=670_091, num_train=490_449, num_test=153_025,
        avg_labels=5.45, avg_nnz=75.68, power_law_exponent=0.8,
        description="shape of Amazon-670K (Extreme Classification Repository)"),
    "delicious-200k": SyntheticSpec(
        num_features=782_585, num_labels=205_443, num_train=196_606, num_test=100_095,
        avg_labels=75.54, avg_nnz=301.17, power_law_exponent=0.9,
        description="shape of Delicious-200K (Extreme Classification Repository)"),
    "synth-20k": SyntheticSpec(
        num_features=50_000, num_labels=20_000, num_train=50_000, num_test=10_000,
        avg_labels=4.0, avg_nnz=60.0, power_law_exponent=0.9,
        description="medium set with 20K labels, trains in minutes"),
    "small": SyntheticSpec(
        num_features=2_000, num_labels=200, num_train=3_000, num_test=1_000,
        avg_labels=3.0, avg_nnz=40.0, description="small set for tests and examples"),
    "tiny": SyntheticSpec(
        num_features=200, num_labels=20, num_train=200, num_test=100,
        avg_labels=2.0, avg_nnz=12.0, description="tiny set for unit tests"),
}


def _spec(preset: Optional[str], shape: dict) -> SyntheticSpec:
    names = {f.name for f in fields(SyntheticSpec)}
    unknown = sorted(set(shape) - names)
    if unknown:
        raise TypeError(f"make_synthetic: unknown parameter(s) {unknown}; known: {sorted(names - {'description'})}")
    if preset is None:
        required = ("num_features", "num_labels", "num_train", "num_test", "avg_labels", "avg_nnz")
        missing = [k for k in required if k not in shape]
        if missing:
            raise TypeError(f"make_synthetic: without a preset, give {', '.join(missing)} "
                            f"(presets: {', '.join(PRESETS)})")
        spec = SyntheticSpec(**shape)
    else:
        if preset not in PRESETS:
            raise ValueError(f"unknown synthetic preset {preset!r}; choose one of {', '.join(PRESETS)}")
        spec = replace(PRESETS[preset], **shape)
    spec.validate()
    return spec


def _zipf_cdf(n: int, exponent: float, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Weights ``rank^-exponent`` over ``n`` ids with ranks shuffled; returns (weights, permutation)."""
    ranks = rng.permutation(n)
    w = (ranks.astype(np.float64) + 1.0) ** (-exponent)
    return w, ranks


class _Sampler:
    """Inverse-CDF sampling from fixed weights: ``draw(u)`` is ``searchsorted(cumsum(w), u, "right")``.

    A guide table (Chen and Asau 1974) maps each of ``2 n`` equal slices of ``[0, total)`` to the
    few candidate ids it can hit, so each query needs ~3 vectorised bisection steps instead of
    ~20 cache-missing ones: several times faster than ``np.searchsorted`` for millions of draws.
    """

    def __init__(self, weights: np.ndarray):
        self.cum = np.cumsum(weights, dtype=np.float64)
        self.total = float(self.cum[-1])
        g = 2 * self.cum.size
        self.guide = np.searchsorted(self.cum, np.arange(g + 1) * (self.total / g), side="right")
        # slices are widened by one on each side against rounding of u * g / total
        span = int((self.guide[3:] - self.guide[:-3]).max()) if g > 3 else self.cum.size
        self.steps = int(math.ceil(math.log2(span + 2))) + 1

    def draw(self, u: np.ndarray) -> np.ndarray:
        g = self.guide.size - 1
        slot = np.minimum((u * (g / self.total)).astype(np.int64), g - 1)
        lo = self.guide[np.maximum(slot - 1, 0)]
        hi = np.minimum(self.guide[np.minimum(slot + 2, g)], self.cum.size - 1)
        for _ in range(self.steps):
            mid = (lo + hi) >> 1
            right = self.cum[mid] <= u
            lo = np.where(right, mid + 1, lo)
            hi = np.where(right, hi, mid)
        return lo


class _Model:
    """The parts shared by train and test: label weights, topics, prototypes, background words."""

    def __init__(self, spec: SyntheticSpec, rng: np.random.Generator):
        L, D, T, P = spec.num_labels, spec.num_features, spec.num_topics, spec.num_prototypes
        self.spec = spec
        w, _ = _zipf_cdf(L, spec.power_law_exponent, rng)
        topic_of = rng.integers(0, T, size=L)
        # labels ordered by topic: each topic's labels form one range of the cumulative weights,
        # so one inverse-CDF draw samples labels from a topic (or from all labels) for many draws
        self.label_order = np.argsort(topic_of, kind="stable").astype(np.int64)
        self.labels = _Sampler(w[self.label_order])
        starts = np.searchsorted(topic_of[self.label_order], np.arange(T + 1))
        before = np.concatenate([[0.0], self.labels.cum])
        self.topic_lo = before[starts[:-1]]
        self.topic_hi = before[starts[1:]]
        topic_w = self.topic_hi - self.topic_lo
        self.topic_cum = np.cumsum(topic_w)

        # features: topic pools (a partition of the feature ids), background Zipf distribution
        feat_topic = rng.integers(0, T, size=D)
        feat_order = np.argsort(feat_topic, kind="stable")
        fstarts = np.searchsorted(feat_topic[feat_order], np.arange(T + 1))
        pool_lo, pool_size = fstarts[:-1], np.diff(fstarts)
        half = int(round(P * spec.topic_share))
        lt = topic_of.astype(np.int64)
        u = rng.random((L, half))
        size = pool_size[lt][:, None]
        in_pool = feat_order[np.minimum(pool_lo[lt][:, None] + (u * size).astype(np.int64),
                                        D - 1)]
        anywhere = rng.integers(0, D, size=(L, P - half))
        # a topic without features (D < T) falls back to uniform ids
        in_pool = np.where(size > 0, in_pool, rng.integers(0, D, size=(L, half)))
        self.protos = np.concatenate([in_pool, anywhere], axis=1).astype(np.int32)
        fw, _ = _zipf_cdf(D, spec.feature_exponent, rng)
        self.features = _Sampler(fw)

        # Repeated feature ids within a point merge into one non-zero, so drawing avg_nnz ids gives
        # fewer non-zeros; two pilot chunks measure the shortfall and scale the draws to match.
        self.scale = 1.0
        pilot_seed = int(rng.integers(0, 2**63 - 1))
        for _ in range(2):
            n = 4096
            x, _ = self.chunk(n, np.random.default_rng(pilot_seed))
            # bounded: an avg_nnz close to num_features cannot be reached by random draws
            self.scale = min(self.scale * spec.avg_nnz / max(x.nnz / n, 1e-9), 8.0)

    def _labels_from(self, lo: np.ndarray, hi: np.ndarray, rng) -> np.ndarray:
        u = lo + rng.random(lo.shape[0]) * (hi - lo)
        return self.label_order[self.labels.draw(u)]

    def chunk(self, n: int, rng: np.random.Generator):
        """Generate ``n`` points: (label csr, feature term-frequency csr)."""
        s, L, D, P = self.spec, self.spec.num_labels, self.spec.num_features, self.protos.shape[1]
        topic = np.searchsorted(self.topic_cum, rng.random(n) * self.topic_cum[-1], side="right")
        topic = np.minimum(topic, self.topic_cum.shape[0] - 1)
        want = np.minimum(1 + rng.poisson(s.avg_labels - 1.0, size=n), L)

        # labels without repetition: draw with replacement, drop repeats, top up the missing ones;
        # a point with many labels can exhaust the frequent labels of its topic, so the last
        # rounds draw from all labels
        keys = np.empty(0, dtype=np.int64)
        need = want.copy()
        for round_ in range(6):
            rows = np.repeat(np.arange(n, dtype=np.int64), need)
            if rows.size == 0:
                break
            t = topic[rows]
            own = rng.random(rows.size) < (s.topic_mix if round_ < 3 else 0.0)
            lo = np.where(own, self.topic_lo[t], 0.0)
            hi = np.where(own, self.topic_hi[t], self.labels.total)
            keys = _sorted_unique(np.concatenate([keys, rows * L + self._labels_from(lo, hi, rng)]))
            need = np.maximum(want - np.bincount(keys // L, minlength=n), 0)
        lab_rows, labs = keys // L, keys % L
        y = sp.csr_matrix((np.ones(keys.size, np.float32), labs.astype(np.int32),
                           np.concatenate([[0], np.cumsum(np.bincount(lab_rows, minlength=n))])),
                          shape=(n, L))

        # distractors: labels a point shows evidence of without carrying them (a document that
        # mentions a topic it is not tagged with), so that no classifier is perfect
        d_rows = np.repeat(np.arange(n, dtype=np.int64), rng.poisson(s.distractors * want))
        t = topic[d_rows]
        own = rng.random(d_rows.size) < s.topic_mix
        d_labs = self._labels_from(np.where(own, self.topic_lo[t], 0.0),
                                   np.where(own, self.topic_hi[t], self.labels.total), rng)
        ev_rows = np.concatenate([lab_rows, d_rows])
        ev_labs = np.concatenate([labs, d_labs])

        # evidence: a random cyclic window of each label's prototypes
        q = min(1.0, self.scale * s.signal_per_label / (P * (1.0 + s.distractors)))
        shown = rng.binomial(P, q, size=ev_rows.size)
        start = rng.integers(0, P, size=ev_rows.size)
        pair = np.repeat(np.arange(ev_rows.size), shown)
        step = np.arange(pair.size) - np.repeat(np.cumsum(shown) - shown, shown)
        sig_feat = self.protos[ev_labs[pair], (start[pair] + step) % P].astype(np.int64)
        sig_rows = ev_rows[pair]
        sig_tf = np.minimum(1 + rng.poisson(0.5, size=pair.size), _TF_MAX)

        # background words; a point left without any feature gets one
        per_row_sig = np.bincount(sig_rows, minlength=n)
        k_noise = rng.poisson(self.scale * s.avg_nnz * (1.0 - s.signal), size=n) + (per_row_sig == 0)
        noise_rows = np.repeat(np.arange(n, dtype=np.int64), k_noise)
        noise_feat = self.features.draw(rng.random(noise_rows.size) * self.features.total)

        # (point, feature) keys carry their term count in the low bits: one sort groups them
        packed = np.concatenate([(sig_rows * D + sig_feat) * (_TF_MAX + 1) + sig_tf,
                                 (noise_rows * D + noise_feat) * (_TF_MAX + 1) + 1])
        packed.sort()
        fkeys = packed // (_TF_MAX + 1)
        first = np.flatnonzero(np.concatenate([[True], fkeys[1:] != fkeys[:-1]]))
        ukeys = fkeys[first]
        tf_sum = np.add.reduceat(packed % (_TF_MAX + 1), first).astype(np.float32)
        frows = ukeys // D
        x = sp.csr_matrix((tf_sum, (ukeys % D).astype(np.int32),
                           np.concatenate([[0], np.cumsum(np.bincount(frows, minlength=n))])),
                          shape=(n, D))
        return x, y


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    # a plain sort: numpy's hash-based np.unique is several times slower on these sizes
    keys = np.sort(keys)
    if keys.size:
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys


def _generate_split(model: _Model, n: int, seed: int, split: int):
    xs, ys = [], []
    for c, lo in enumerate(range(0, n, _CHUNK)):
        rng = np.random.default_rng(np.random.SeedSequence([seed, split, c]))
        x, y = model.chunk(min(_CHUNK, n - lo), rng)
        xs.append(x)
        ys.append(y)
    if not xs:
        return (sp.csr_matrix((0, model.spec.num_features), dtype=np.float32),
                sp.csr_matrix((0, model.spec.num_labels), dtype=np.float32))
    return sp.vstack(xs, format="csr"), sp.vstack(ys, format="csr")


def _tfidf_l2(x: sp.csr_matrix, idf: np.ndarray) -> sp.csr_matrix:
    x = x.copy()
    x.data = ((1.0 + np.log(x.data)) * idf[x.indices]).astype(np.float32)
    return normalize_rows(x, "l2")


def make_synthetic_arrays(preset: Optional[str] = None, *, seed: int = 0, **shape):
    """Like :func:`make_synthetic` but returns scipy matrices
    ``(train_features, train_labels, test_features, test_labels)`` (CSR, float32, sorted indices)."""
    spec = _spec(preset, shape)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    model = _Model(spec, np.random.default_rng(np.random.SeedSequence([int(seed), 0])))
    xtr, ytr = _generate_split(model, spec.num_train, int(seed), 1)
    xte, yte = _generate_split(model, spec.num_test, int(seed), 2)
    idf = idf_weights(xtr, dtype=np.float64)
    return _tfidf_l2(xtr, idf), ytr, _tfidf_l2(xte, idf), yte


def make_synthetic(preset: Optional[str] = None, *, seed: int = 0, **shape):
    """Generate a learnable synthetic data set; returns ``(train, test)`` as :class:`slide.Dataset`.

    ``preset`` is one of :data:`PRESETS` (``amazon-670k``, ``delicious-200k``, ``synth-20k``,
    ``small``, ``tiny``); keyword arguments override its fields (``num_train=10_000``), or,
    without a preset, give at least ``num_features, num_labels, num_train, num_test, avg_labels,
    avg_nnz``; optional: ``power_law_exponent`` (label Zipf exponent), ``feature_exponent``
    (background word Zipf exponent), ``signal`` (share of non-zeros that are label evidence),
    ``topics`` (0 = about sqrt(num_labels)), ``topic_mix``, ``topic_share``, ``distractors``,
    ``prototypes`` (0 = derived). The same seed and shape always give the same data.

    Generation is vectorised numpy and takes about a minute for ``amazon-670k`` (peak memory
    about 1.5 GB). Raises ``ValueError`` naming an invalid parameter value, ``TypeError`` for an
    unknown parameter name.
    """
    from ..data import Dataset

    xtr, ytr, xte, yte = make_synthetic_arrays(preset, seed=seed, **shape)
    d, l = xtr.shape[1], ytr.shape[1]
    return (Dataset(xtr, ytr, num_features=d, num_labels=l),
            Dataset(xte, yte, num_features=d, num_labels=l))


def stats(features: sp.csr_matrix, labels: sp.csr_matrix) -> dict:
    """Summary numbers of one split (the same columns as the Extreme Classification Repository tables)."""
    n = features.shape[0]
    lab_count = np.diff(labels.tocsc().indptr)
    return {
        "points": int(n),
        "features": int(features.shape[1]),
        "labels": int(labels.shape[1]),
        "avg_labels_per_point": float(labels.nnz / n) if n else 0.0,
        "avg_nnz_per_point": float(features.nnz / n) if n else 0.0,
        "avg_points_per_label": float(labels.nnz / labels.shape[1]),
        "labels_present": int(np.count_nonzero(lab_count)),
        "max_label_count": int(lab_count.max()) if lab_count.size else 0,
    }


def write_synthetic(preset: Optional[str], out_dir, seed: int = 0, **shape) -> Dict[str, str]:
    """Generate a preset and write ``train.txt``, ``test.txt`` (XC text format) and ``stats.json``.

    Returns the paths written: ``{"train": ..., "test": ..., "stats": ...}``. ``stats.json`` holds
    the generator parameters, the seed, per-split statistics and the generation time.
    """
    t0 = time.perf_counter()
    spec = _spec(preset, shape)
    train, test = make_synthetic(preset, seed=seed, **shape)
    gen_seconds = time.perf_counter() - t0
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"train": os.path.join(out_dir, "train.txt"), "test": os.path.join(out_dir, "test.txt"),
             "stats": os.path.join(out_dir, "stats.json")}
    train.save(paths["train"])
    test.save(paths["test"])
    info = {
        "preset": preset, "seed": int(seed), "spec": asdict(spec),
        "train": stats(train.features, train.labels), "test": stats(test.features, test.labels),
        "generate_seconds": round(gen_seconds, 3),
        "write_seconds": round(time.perf_counter() - t0 - gen_seconds, 3),
    }
    atomic_write_text(paths["stats"], json.dumps(info, indent=2) + "\n")
    return paths
