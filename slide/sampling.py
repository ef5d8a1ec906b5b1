"""``sampling: auto``: which layers are hash-sampled (LSH) and which are computed densely."""
from __future__ import annotations

from typing import List

from . import memory as _memory
from .config import Config, ConfigError

__all__ = ["choose_sampling", "resolve_output_activation", "AUTO_LSH_MIN_NEURONS",
           "AUTO_LSH_MAX_ACTIVE_FRACTION"]

# sampling: auto -- below this many neurons a dense layer (trained as batched matrix products)
# is the better choice, and above this fraction active hashing saves too little. Chosen on
# validation splits of generated sets with 5,000-20,000 labels (benchmarks/sampling_auto.py, its
# table in benchmarks/README.md): with the default 1,024 hidden units the dense sigmoid layer
# took 1.4x and 3.3x LSH's seconds at 10,000 and 20,000 labels for 0.065 and 0.072 less P@1, and
# with 128 hidden units it did not learn; 5,000 labels stay dense (4,000 active is hardly sampling).
AUTO_LSH_MIN_NEURONS = 10_000

AUTO_LSH_MAX_ACTIVE_FRACTION = 0.4


def choose_sampling(config: Config, num_labels: int) -> List[str]:
    """Resolve every layer's ``sampling`` to ``"dense"`` or ``"lsh"``.

    ``auto`` picks LSH when the layer has at least :data:`AUTO_LSH_MIN_NEURONS` neurons and the
    expected active set (from ``lsh.L``, ``bucket_capacity``, ``min_active``, ``max_active``) is
    at most :data:`AUTO_LSH_MAX_ACTIVE_FRACTION` of the layer; dense otherwise. The first layer
    reads the sparse input directly and is always dense (hashing it buys nothing: its cost is
    already proportional to the input's non-zeros).
    """
    sizes = _memory.layer_sizes(config, num_labels)
    out = []
    for i, (layer, size) in enumerate(zip(config.layers, sizes)):
        if layer.sampling == "lsh" and i == 0:
            raise ConfigError("layers.0.sampling: the first layer reads the sparse input and is "
                              "always dense; lsh is allowed on later layers only")
        if layer.sampling != "auto" or i == 0:
            out.append("dense" if i == 0 else layer.sampling)
            continue
        active = _memory.expected_active(layer.lsh, size)
        lsh = size >= AUTO_LSH_MIN_NEURONS and active <= AUTO_LSH_MAX_ACTIVE_FRACTION * size
        out.append("lsh" if lsh else "dense")
    return out


def resolve_output_activation(activation: str, sampling: str, key: str = "activation") -> str:
    """``activation: auto`` of the output layer: ``sigmoid`` (per-label binary cross-entropy)
    on a dense output layer, ``softmax`` on a hash-sampled one. Other values are returned
    unchanged (``sigmoid`` on a hash-sampled layer trains a per-label binary loss on the
    sampled neurons, weighted by ``lsh.negative_weight``).

    Why sigmoid where it can: on validation splits of the 12 real sets of ``../shared/datasets``
    (the auto search on 80% of train, scored on the other 20%, one thread) the per-label binary
    loss scored higher than softmax on 9 sets, level on 1 and lower on 2 by at most 0.006
    (README, Configuration).
    """
    if activation != "auto":
        return activation
    return "sigmoid" if sampling == "dense" else "softmax"
