"""Memory needed by a network, known before anything is allocated.

:func:`estimate` sizes every big allocation of the engine from the configuration and the data
shape; :func:`check_fits` compares the total with the RAM that is available now and raises
:class:`MemoryError` (with both numbers) instead of letting the process be killed halfway
through start-up. :meth:`slide.Network.fit` calls it before creating the engine.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ._util import format_bytes
from .config import Config

__all__ = ["estimate", "check_fits", "keeps_best_copy", "layer_sizes", "expected_active", "format_bytes"]

_F32 = 4
_I32 = 4
# Bits that one hash code adds to a bucket id when range_pow is 0 (derived): SimHash gives one
# sign bit per code; (D)WTA codes are the winner's position inside a bin of 8.
_BITS_PER_CODE = {"simhash": 1, "wta": 3, "dwta": 3}
_MAX_DERIVED_RANGE_POW = 20
# Engine constants (cpp/src/engine/network.cpp): dense layers wider than this accumulate into a
# shared gradient buffer; LSH layers wider than this many times their active set add in-batch
# negatives.
_MAX_RECORDED_WIDTH = 4096
_IN_BATCH_WIDTH = 2


def layer_sizes(config: Config, num_labels: int) -> List[int]:
    """Neurons per layer, the output layer resolved to ``num_labels``."""
    sizes = [layer.size for layer in config.layers]
    sizes[-1] = int(num_labels) if config.layers[-1].size is None else int(sizes[-1])
    return [int(s) for s in sizes]


def range_pow(lsh) -> int:
    """Bits of a bucket id: ``lsh.range_pow``, or derived from K and the family when 0."""
    if lsh.range_pow:
        return int(lsh.range_pow)
    return min(_MAX_DERIVED_RANGE_POW, lsh.K * _BITS_PER_CODE[lsh.family])


def expected_active(lsh, size: int) -> int:
    """Upper estimate of the active neurons per sample of an LSH layer of ``size`` neurons."""
    union = lsh.L * lsh.bucket_capacity
    if lsh.selection == "threshold":
        union = max(1, union // max(1, lsh.threshold))
    active = max(lsh.min_active, union)
    if lsh.max_active:
        active = min(active, lsh.max_active)
    return int(min(size, active))


def _table_bytes(bits: int, num_items: int) -> int:
    """Upper bound of one hash table's bytes for ``num_items`` neurons.

    The engine stores each neuron once per table (buckets back to back) with offsets over the
    occupied buckets: indexed directly by bucket id while ``2^bits`` is small next to the item
    count, else through an open-addressing map of at least twice the occupied buckets. Memory
    therefore grows with the neurons, not with ``2^bits x bucket_capacity``.
    """
    ids = 1 << bits
    items = num_items * _I32
    if ids <= 2 * num_items + 1024:
        return items + (ids + 1) * _I32
    occupied = min(ids, num_items)
    slots = 16
    while slots < 2 * occupied:
        slots <<= 1
    # offsets are appended to after a copy, so their vector may hold twice its size
    return items + 2 * (occupied + 1) * _I32 + 2 * slots * _I32


def _label_vector_bytes(config: Config, num_features: int, num_labels: int,
                        num_points: Optional[int]) -> int:
    """Upper bound of the ridge label vectors' memory while training (slide.centroids.build_ridge
    and choose): the Gram matrix and its factor, the right-hand sides, one features x labels
    float32 matrix per penalty tried and the cached validation scores; 0 where no ridge vectors
    are built (``centroid_weight: 0``, ``centroid_kind: mean``, or ``auto`` outside the gate of
    ``slide.centroids.ridge_fits``)."""
    from . import centroids as _centroids

    out = config.layers[-1]
    d, L = int(num_features), int(num_labels)
    if out.centroid_weight == 0.0 or out.centroid_kind == "mean":
        return 0
    n = int(num_points) if num_points is not None else None
    if out.centroid_kind == "auto":
        if out.centroid_weight != "auto":     # a set weight with kind auto means the centroids
            return 0
        if not _centroids.ridge_fits(n if n is not None else 0, d, L):
            return 0
    k = min(d, _centroids.RIDGE_MAX_DIM) if n is None else min(n, d, _centroids.RIDGE_MAX_DIM)
    penalties = 1 if out.centroid_weight != "auto" else len(_centroids.RIDGE_LAMBDAS)
    # validation rows: at most 5,000 (the search's split) unless a split of its own is given
    n_valid = 5000 if n is None else min(n, 5000)
    cache = min(_centroids.SCORE_CACHE_BYTES, n_valid * L * _F32 * (penalties + 1))
    return 2 * k * k * _F32 + 2 * k * L * _F32 + penalties * d * L * _F32 + cache


def keeps_best_copy(config: Config) -> bool:
    """Whether training keeps a copy of the best weights and their Adam moments, to put them back
    at the end (``training.restore_best``): with validation data (``data.valid``,
    ``data.valid_fraction``, or the split that ``epochs: auto`` holds out of train), except on
    the ``epochs: auto`` path that refits on all of train instead (``training.refit``)."""
    tr, d = config.training, config.data
    auto = tr.epochs == "auto"
    has_valid = bool(d.valid) or d.valid_fraction > 0 or auto
    refit = auto and tr.refit and not d.valid
    return bool(tr.restore_best and has_valid and not refit)


def estimate(config: Config, num_features: int, num_labels: int,
             sampling: Optional[List[str]] = None, num_points: Optional[int] = None,
             best_copy: Optional[bool] = None) -> Dict[str, int]:
    """Bytes needed by a network for this configuration and data shape.

    Returns a dict with ``weights`` (weights and biases: float32, or bfloat16 weights on layers
    with ``precision: bf16``), ``adam`` (two moments per weight, stored like the weights), ``gradients`` (shared gradient buffers of dense layers wider than 4096), ``hash_tables`` (an upper bound for the LSH layers' tables), ``batch`` (per-sample
    activations, gradients and active-set ids for one batch), ``centroids`` (an upper bound for the
    label-centroid term: on an output layer wider than slide.centroids.FULL_LABELS the pruned
    centroids, on a narrower one the dense copy they are scored through; 0 when
    ``centroid_weight`` is 0), ``label_vectors`` (an upper bound for the ridge label vectors
    that ``centroid_kind: auto`` or ``ridge`` builds and tries while training, from
    ``num_points`` training points when given, else from the largest problem the gate admits),
    ``best_copy`` (the copy of the weights and moments of the best validation evaluation that
    ``training.restore_best`` keeps: the size of ``weights`` and ``adam``, or 0; whether it is
    kept is ``best_copy``, or when None :func:`keeps_best_copy` of the configuration) and
    ``total``. ``sampling`` is the resolved
    per-layer choice (``"dense"``/``"lsh"``); by default a layer counts as LSH when configured
    ``lsh``, and ``auto`` counts as LSH (the larger of the two for the hash tables).
    """
    config = Config.load(config)
    sizes = layer_sizes(config, num_labels)
    if sampling is None:
        sampling = ["dense" if layer.sampling == "dense" or i == 0 else "lsh"
                    for i, layer in enumerate(config.layers)]
    weights = adam = tables = gradients = batch_per_sample = 0
    fan_in = int(num_features)
    for i, (layer, size) in enumerate(zip(config.layers, sizes)):
        n_params = fan_in * size + size
        # bf16 layers store weights and moments in 2 bytes; biases and their moments stay float32
        w_bytes = 2 if layer.precision == "bf16" else _F32
        weights += fan_in * size * w_bytes + size * _F32
        adam += 2 * (fan_in * size * w_bytes + size * _F32)
        if sampling[i] == "lsh":
            lsh = layer.lsh
            tables += lsh.L * _table_bytes(range_pow(lsh), size)
            active = expected_active(lsh, size)
            # A layer more than twice as wide as its active set also scores the batch's labels
            # (in-batch negatives, at most max_active more; see cpp/include/slide/network.hpp).
            if lsh.min_active > 0 and size > _IN_BATCH_WIDTH * max(lsh.min_active, lsh.max_active):
                active = min(size, active + (lsh.max_active or active))
            # activation, gradient, active id, and the sample's gradient record (row, coefficient)
            batch_per_sample += active * (3 * _F32 + 2 * _I32)
            gradients += size * _I32  # per-row entry offsets of the records
        else:
            # outputs, gradients and dropout multipliers of the whole batch, and a counter
            batch_per_sample += size * (3 * _F32 + _I32)
            if size > _MAX_RECORDED_WIDTH:
                gradients += n_params * _F32  # a shared (lock-free) gradient buffer
            else:
                gradients += (fan_in if i == 0 else size) * _I32  # per-row entry offsets
        fan_in = size
    batch = batch_per_sample * int(config.training.batch_size)
    # The label-centroid term (slide.centroids) on a wide output layer: at most MAX_FEATURES
    # entries a label (value and column) and a row pointer a feature. Narrower layers keep every
    # entry, bounded by the training data (a label's points' distinct features), not counted,
    # and where slide.centroids.dense_scoring allows, a dense float32 copy for scoring, counted.
    from . import centroids as _centroids

    centroid_bytes = 0
    out_layer = config.layers[-1]
    if out_layer.centroid_weight != 0.0 and sizes[-1] > _centroids.FULL_LABELS:
        centroid_bytes = sizes[-1] * _centroids.MAX_FEATURES * (_F32 + _I32) + (int(num_features) + 1) * 8
        # and each thread's scratch of a float and a byte a label (slide._core.label_pools)
        from . import _core

        threads = config.training.threads or _core.default_threads()
        centroid_bytes += threads * sizes[-1] * (_F32 + 1)
    elif (out_layer.centroid_weight != 0.0 and out_layer.centroid_kind != "ridge"
          and _centroids.dense_scoring(int(num_features), sizes[-1])):
        centroid_bytes = int(num_features) * sizes[-1] * _F32
    out = {"weights": weights, "adam": adam, "gradients": gradients, "hash_tables": tables, "batch": batch,
           "centroids": centroid_bytes,
           "label_vectors": _label_vector_bytes(config, num_features, num_labels, num_points),
           "best_copy": weights + adam if (keeps_best_copy(config) if best_copy is None else best_copy) else 0}
    out["total"] = sum(out.values())
    return out


def check_fits(config: Config, num_features: int, num_labels: int,
               sampling: Optional[List[str]] = None, available: Optional[int] = None,
               headroom: float = 0.9, num_points: Optional[int] = None,
               best_copy: Optional[bool] = None) -> Dict[str, int]:
    """Return :func:`estimate`, or raise MemoryError when it exceeds ``headroom`` x available RAM.

    ``available`` defaults to ``psutil.virtual_memory().available``. The message gives the
    estimate by part and the available memory, so the user knows which setting to shrink.
    """
    est = estimate(config, num_features, num_labels, sampling=sampling, num_points=num_points,
                   best_copy=best_copy)
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    if est["total"] > headroom * available:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in est.items() if k != "total")
        raise MemoryError(
            f"the network needs about {format_bytes(est['total'])} ({parts}) for "
            f"{num_features} features and {num_labels} labels, but only {format_bytes(available)} "
            f"of memory is available; use fewer labels per model, a smaller hidden layer, "
            f"fewer hash tables (lsh.L) or a smaller training.batch_size"
            + (f"; layers.{len(config.layers) - 1}.centroid_kind: mean saves the label vectors' "
               f"{format_bytes(est['label_vectors'])}" if est["label_vectors"] else "")
            + (f"; training.restore_best: false saves the copy of the best weights, "
               f"{format_bytes(est['best_copy'])}" if est["best_copy"] else ""))
    return est
