"""Pinned results: the engine must keep producing the same bits for fixed configurations.

tests/pinned_run.py trains five fully explicit configurations (dense output layer, LSH
output layer with DWTA, LSH output layer with SimHash/top-k/reservoir and two hidden
layers, an LSH hidden layer, a first layer wide enough for lock-free gradients) on 480 bibtex rows with one thread and a fixed seed, and fingerprints every
parameter array, the batch losses and the top-5 predictions of 24 held-out rows.
tests/data/pinned.json holds those fingerprints per kernel set; a refactoring of the
engine must leave them unchanged. Regenerate only for an intended change of results:
    python tests/pinned_run.py --write
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pinned_run  # noqa: E402

with open(pinned_run.FIXTURE) as f:
    PINNED = json.load(f)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_pinned_bits(isa):
    if isa not in pinned_run.available_isas():
        pytest.skip(f"this CPU has no {isa} kernels")
    if isa not in PINNED:
        pytest.skip(f"no pinned results recorded for {isa}")
    got = pinned_run.run_isa(isa)
    assert got["isa"] == isa
    want = PINNED[isa]
    for name in ("dense", "lsh", "lsh_simhash", "lsh_hidden", "wide_hidden"):
        for key, value in want[name].items():
            assert got[name][key] == value, f"{isa}/{name}/{key} changed"
