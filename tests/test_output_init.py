"""layers[-1].init: centroid, the output layer started from label centroids."""
import numpy as np
import pytest

import slide
from slide.datasets import make_synthetic


def _cfg(init="centroid", hidden=32, sampling="dense"):
    cfg = slide.Config()
    cfg.layers[0].size = hidden
    cfg.layers[-1].init = init
    cfg.layers[-1].sampling = sampling
    cfg.layers[-1].activation = "softmax"
    cfg.training.threads = 1
    return cfg


def test_rows_are_the_labels_mean_hidden_representations(bibtex):
    train = bibtex[0][:400]   # few points: labels with one point, and labels with none
    net = slide.Network(_cfg(), epochs=1, lr=1e-12, dropout=0.0)   # the weights stay at their start
    glorot = slide.Network(_cfg("glorot"), num_features=train.num_features, num_labels=train.num_labels)
    net.fit(train)
    p = net.parameters()
    X = net._normalize(train.features.astype(np.float32))
    H = np.maximum(X @ p["layers.0.weight"] + p["layers.0.bias"], 0)
    Y = train.labels.tocsc()
    counts = np.diff(Y.indptr)
    W = p["layers.1.weight"]
    for j in [int(np.argmax(counts)), int(np.flatnonzero(counts == 1)[0]), int(np.flatnonzero(counts == 2)[0])]:
        c = H[Y.indices[Y.indptr[j]:Y.indptr[j + 1]]].mean(axis=0)
        np.testing.assert_allclose(W[j], 10.0 * c / np.linalg.norm(c), rtol=1e-4, atol=1e-6)
    # labels without training points keep their random (glorot) rows
    empty = np.flatnonzero(counts == 0)
    assert empty.size > 0
    np.testing.assert_allclose(W[empty], glorot.parameters()["layers.1.weight"][empty], atol=1e-9)


def test_centroid_start_learns_a_wide_layer_sooner():
    train, test = make_synthetic("small", seed=1, num_labels=5000, num_features=10_000, num_train=8_000)
    p1 = {}
    for init in ("glorot", "centroid"):
        cfg = _cfg(init, hidden=128, sampling="lsh")
        net = slide.Network(cfg, epochs=1, lr=1e-2, dropout=0.0)
        net.fit(train)
        p1[init] = net.evaluate(test)["P@1"]
    # measured after one epoch: glorot 0.279, centroid 0.656
    assert p1["centroid"] > 0.55 and p1["centroid"] > p1["glorot"] + 0.2, p1


@pytest.mark.parametrize("layers,msg", [
    ([{"size": 64, "init": "centroid"}, {"size": None}], r"layers\.0\.init: centroid is only allowed on the last"),
    ([{"size": None, "init": "centroid"}], r"layers\.0\.init: centroid initialises the output layer after a hidden"),
    ([{"size": 64}, {"size": None, "init": "zeros"}], r"layers\.1\.init"),
])
def test_bad_init_is_refused_naming_the_key(layers, msg):
    with pytest.raises(slide.ConfigError, match=msg):
        slide.Config.from_dict({"layers": layers})
