"""Accuracy bands on real extreme-classification data with the default settings.

The data sets are the Bibtex and Delicious copies shipped in ``datasets/`` (fixtures in
conftest.py). The bands are the targets the defaults were tuned for (on
validation splits of train, never on test: benchmarks/tune_defaults.py): a dense 128-ReLU
PyTorch network reaches 0.586 / 0.647 test P@1 on them and a linear PECOS model 0.635 / 0.677.
Measured with the defaults (seed 0): 0.645 / 0.688. The default settings on Delicious are
checked by their validation band in tests/test_real_sets.py (one run of the same defaults, where
this file had a second, 73 s, on the test split).

The runs use one thread: a single-thread run with a fixed seed is bit-identical, so a band
check cannot flip between runs (several threads train lock-free and differ run to run).
"""
import numpy as np
import pytest

import slide


@pytest.fixture(scope="module")
def bibtex_default_p1(bibtex):
    """Test P@1 of the default network on Bibtex (one thread: the same bits for every test that
    reads it, so it is trained once)."""
    train, test = bibtex
    net = slide.Network(threads=1)
    net.fit(train)
    return net.evaluate(test)["P@1"]


@pytest.mark.slow   # trains on the full data set
def test_bibtex_default_settings(bibtex_default_p1):
    assert bibtex_default_p1 >= 0.63, bibtex_default_p1


@pytest.mark.slow   # trains on the full data set
def test_early_stopping_keeps_the_best_epoch(bibtex):
    train, _ = bibtex
    rows = np.random.default_rng(0).permutation(len(train))
    valid, fit_part = train[np.sort(rows[:800])], train[np.sort(rows[800:])]
    # no dropout and a large constant step: validation P@1 peaks early, then the model overfits
    # (32 batches an epoch: the early-stopping floor of 2 x lr_decay_min_steps batches is 2 epochs)
    net = slide.Network(threads=1, hidden=128, dropout=0.0, lr=0.03, lr_decay=1.0, epochs=12,
                        patience=2, restore_best=True, lr_decay_min_steps=32)
    hist = net.fit(fit_part, valid=valid)
    scores = hist["valid/P@1"]
    best = int(np.argmax(scores))
    assert hist.stopped_early and best == len(scores) - 3
    assert hist.best_epoch == hist.records[best]["epoch"] == best + 1
    # the restored network alone scores the best epoch's P@1; with the label-centroid term chosen
    # on the same points (centroid_weight: auto) it scores what the choice measured
    assert hist.centroid_search[0.0] == pytest.approx(scores[best], abs=1e-12)
    assert net.evaluate(valid)["P@1"] == pytest.approx(hist.centroid_search[hist.centroid_weight], abs=1e-12)


@pytest.mark.slow   # trains on the full data set
def test_lsh_output_layer_matches_dense_on_delicious(delicious):
    train, test = delicious
    # about a third to a half of the 983 labels active per sample, chosen by SimHash tables
    lsh_settings = {"family": "simhash", "K": 5, "L": 32, "bucket_capacity": 64,
                    "min_active": 250, "max_active": 500}
    common = dict(threads=1, epochs=5, hidden=128)
    dense = slide.Network(sampling="dense", **common)
    dense.fit(train)
    cfg = slide.Network(sampling="lsh", **common).config.to_dict()
    cfg["layers"][-1]["lsh"].update(lsh_settings)
    lsh = slide.Network(cfg)
    lsh.fit(train)
    assert dense.resolved_sampling == ["dense", "dense"]
    assert lsh.resolved_sampling == ["dense", "lsh"]
    p_dense = dense.evaluate(test)["P@1"]
    p_lsh = lsh.evaluate(test)["P@1"]
    assert p_lsh >= p_dense - 0.02, (p_lsh, p_dense)


@pytest.mark.slow   # trains on the full data set
def test_lsh_output_layer_matches_dense_on_bibtex(bibtex, bibtex_default_p1):
    train, test = bibtex
    # 20-60 of the 159 labels active per sample (plus the sample's own), chosen by SimHash tables;
    # the layer is more than twice as wide as its active set, so the batch's labels are negatives
    lsh_settings = {"family": "simhash", "K": 5, "L": 20, "bucket_capacity": 32,
                    "min_active": 20, "max_active": 60}
    cfg = slide.Network(sampling="lsh", threads=1).config.to_dict()
    cfg["layers"][-1]["lsh"].update(lsh_settings)
    lsh = slide.Network(cfg)
    lsh.fit(train)
    assert lsh.resolved_sampling == ["dense", "lsh"]
    p_dense = bibtex_default_p1    # the default network: a dense output layer on 159 labels
    p_lsh = lsh.evaluate(test)["P@1"]
    most_frequent = 0.136
    assert p_dense > most_frequent + 0.4 and p_lsh > most_frequent + 0.4, (p_dense, p_lsh)
    assert p_lsh >= p_dense - 0.02, (p_lsh, p_dense)
