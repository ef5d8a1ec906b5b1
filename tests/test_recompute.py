"""training.recompute: activation recomputation on the batched dense path.

What a user relies on: the same weights as the stored path (bit for bit: the backward pass
recomputes with the same kernels and regenerates the dropout masks from the same streams),
less activation memory, and a clear error where it cannot apply.
"""
import numpy as np
import pytest

import slide
from slide.config import Config, ConfigError
from test_engine import Network, make_problem, train


def deep_spec(hidden, dropout, threads=1, recompute=False, C=16):
    layers = [dict(size=h, activation="relu") for h in hidden] + [dict(size=C, activation="softmax")]
    return dict(input_dim=400, layers=layers, threads=threads, seed=7, dropout=dropout, recompute=recompute,
                weight_decay=1e-4)


def trained(spec, x, lab, epochs=2):
    net = Network(spec)
    losses = train(net, x, lab, epochs=epochs, batch=50, lr=5e-3)
    return net, losses


@pytest.mark.parametrize("hidden", [[40], [40, 36], [48, 40, 36], [40, 36, 32, 28, 24],
                                    [40, 24, 36, 20, 32, 28, 16, 30]])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_recompute_gives_the_stored_paths_bits(hidden, dropout):
    x, lab, _ = make_problem(n=300)
    stored, l1 = trained(deep_spec(hidden, dropout), x, lab)
    recomputed, l2 = trained(deep_spec(hidden, dropout, recompute=True), x, lab)
    assert l1 == l2
    p1, p2 = stored.parameters(), recomputed.parameters()
    assert p1.keys() == p2.keys()
    for name in p1:   # weights, biases and both Adam moments of every layer
        assert np.array_equal(p1[name], p2[name]), name
    px = stored.predict_topk(*x, 3), recomputed.predict_topk(*x, 3)
    assert np.array_equal(px[0][0], px[1][0]) and np.array_equal(px[0][1], px[1][1])


def test_recompute_bits_do_not_depend_on_threads():
    x, lab, _ = make_problem(n=300)
    one, _ = trained(deep_spec([48, 40, 36], 0.3, threads=1, recompute=True), x, lab)
    two, _ = trained(deep_spec([48, 40, 36], 0.3, threads=2, recompute=True), x, lab)
    for name, v in one.parameters().items():
        assert np.array_equal(v, two.parameters()[name]), name


def test_recompute_keeps_less_activation_memory():
    x, lab, _ = make_problem(n=300)
    hidden = [256, 256, 256]
    reports = {}
    for rc in (False, True):
        net, _ = trained(deep_spec(hidden, 0.5, recompute=rc), x, lab, epochs=1)
        reports[rc] = net.memory_report()
        assert reports[rc]["activations"] <= reports[rc]["scratch"]
    # Stored: outputs, masks and deltas of 3 hidden layers (9 matrices of batch x 256).
    # Recomputed: at most 4 at a time (in the backward pass of layer 2: layer 0's output, layer
    # 1's recomputed output, the deltas of layers 2 and 1), and each sample's stream (32 bytes)
    # before each hidden layer's dropout.
    floats = 50 * 256
    rest = reports[False]["activations"] - 9 * floats * 4   # output layer, per-sample streams, losses
    assert rest >= 0
    assert reports[True]["activations"] == 4 * floats * 4 + rest + 3 * 50 * 32
    assert reports[True]["activations"] < 0.6 * reports[False]["activations"]


def test_recompute_is_refused_with_hash_sampled_layers():
    with pytest.raises(ValueError, match=r"training\.recompute.*layers\.1\.sampling is lsh"):
        Network(dict(deep_spec([32], 0.0, recompute=True),
                     layers=[dict(size=32, activation="relu"),
                             dict(size=64, activation="softmax", sampling="lsh", K=2, L=4, min_active=4,
                                  max_active=8)]))
    with pytest.raises(ValueError, match=r"training\.recompute.*layers\.0\.size=5000"):
        Network(deep_spec([5000], 0.0, recompute=True))


def test_recompute_through_the_python_api(tmp_path):
    cfg = Config.from_dict({"training": {"recompute": True}})
    assert cfg.training.recompute is True and Config().training.recompute is False
    with pytest.raises(ConfigError, match="training.recompute"):
        Config.from_dict({"training": {"recompute": "yes"}})
    rng = np.random.default_rng(0)
    import scipy.sparse as sp
    X = sp.random(200, 50, density=0.1, format="csr", random_state=1, dtype=np.float32)
    Y = sp.csr_matrix((np.ones(200, np.float32), rng.integers(0, 5, 200), np.arange(201)), shape=(200, 5))
    nets = [slide.Network({"training": {"recompute": rc, "epochs": 2, "threads": 1},
                           "layers": [{"size": 32}, {"size": 32}, {"size": None, "activation": "softmax"}]})
            for rc in (False, True)]
    for net in nets:
        net.fit((X, Y))
    assert nets[1]._core.spec["recompute"] is True
    for name, v in nets[0].parameters().items():
        assert np.array_equal(v, nets[1].parameters()[name]), name
    lsh = slide.Network({"training": {"recompute": True, "epochs": 1},
                         "layers": [{"size": 16}, {"size": None, "activation": "softmax", "sampling": "lsh"}]})
    with pytest.raises(ValueError, match="training.recompute"):
        lsh.fit((X, Y))
