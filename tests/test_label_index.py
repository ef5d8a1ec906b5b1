"""predict(mode="index"): the inference index over the output rows. What a user serving queries
relies on: probing everything is exact scoring, a few probes keep most of the accuracy, the index
follows the weights (training, loading, written parameters), and bad arguments say what is wrong.
Timings and the full-size figures are benchmarks/inference_latency.py's."""
import json
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.network import PREDICT_MODES, Network

from test_network import make_problem

NUM_LABELS = 500


def p_at_1(top, Y):
    Y = sp.csr_matrix(Y)
    return float(np.mean([t >= 0 and Y[i, t] != 0 for i, t in enumerate(top)]))


def small_config(sampling="lsh", epochs=6):
    out = {"activation": "softmax", "sampling": sampling}
    if sampling == "lsh":
        out["lsh"] = {"K": 3, "L": 10, "min_active": 60, "max_active": 300}
    return {"layers": [{"size": 48}, out],
            "training": {"epochs": epochs, "batch_size": 64, "threads": 2, "seed": 3, "rebuild_first": 10}}


@pytest.fixture(scope="module")
def problem():
    X, Y = make_problem(n=6000, num_features=3000, num_labels=NUM_LABELS, seed=7)
    return (X[:5000], Y[:5000]), (X[5000:], Y[5000:])


@pytest.fixture(scope="module")
def trained(problem):
    train, _ = problem
    net = Network(small_config(), lr=0.02)
    net.fit(train)
    return net


def test_probing_every_cluster_equals_exact_scoring(trained, problem):
    _, (X, _) = problem
    info = trained.build_index()
    assert info["built"] and info["rows"] == NUM_LABELS and 1 < info["clusters"] <= NUM_LABELS
    exact_l, exact_s = trained.predict(X, k=10, mode="exact")
    index_l, index_s = trained.predict(X, k=10, mode="index", probe=info["clusters"])
    np.testing.assert_array_equal(index_l, exact_l)
    np.testing.assert_allclose(index_s, exact_s, rtol=1e-4, atol=1e-7)
    # More probes than clusters is the same as all of them.
    np.testing.assert_array_equal(trained.predict(X, k=10, mode="index", probe=10**6)[0], exact_l)


def test_probing_every_cluster_equals_exact_on_a_dense_output_layer(problem):
    train, (X, _) = problem
    net = Network(small_config("dense", epochs=1), lr=0.02)
    net.fit(train)
    clusters = net.build_index()["clusters"]
    np.testing.assert_array_equal(net.predict(X, k=5, mode="index", probe=clusters)[0],
                                  net.predict(X, k=5, mode="exact")[0])


def test_a_few_probes_keep_the_accuracy_of_exact_scoring(trained, problem):
    _, (X, Y) = problem
    clusters = trained.build_index()["clusters"]
    exact = trained.predict(X, k=1, mode="exact")[0][:, 0]
    top = {p: trained.predict(X, k=1, mode="index", probe=p)[0][:, 0] for p in (8, 32)}
    default = trained.predict(X, k=1, mode="index")[0][:, 0]
    agree = {p: np.mean(t == exact) for p, t in top.items()}
    # Figures behind the bands (500 labels whose rows have little cluster structure: each label
    # owns its own features): ~146 clusters; exact P@1 0.93; probe 8 finds the exact top label
    # of 74% of the rows, probe 32 of 95% (P@1 -0.02), the default 64 of 99% (P@1 -0.002).
    assert 100 < clusters < 200
    assert p_at_1(exact, Y) >= 0.85
    assert agree[8] >= 0.6 and agree[32] >= 0.88 and np.mean(default == exact) >= 0.96
    assert agree[8] <= agree[32] <= np.mean(default == exact)
    assert p_at_1(top[32], Y) >= p_at_1(exact, Y) - 0.05
    assert p_at_1(default, Y) >= p_at_1(exact, Y) - 0.02


def test_index_predictions_have_the_documented_format(trained, problem):
    _, (X, _) = problem
    labels, scores = trained.predict(X, k=7, mode="index", probe=1)
    assert labels.dtype == np.int32 and scores.dtype == np.float32 and labels.shape == (X.shape[0], 7)
    for lab, sc in zip(labels, scores):
        valid = lab >= 0
        assert valid[0] and not np.any(valid[1:] & ~valid[:-1])
        assert np.all(sc[~valid] == 0) and np.all(np.diff(sc[valid]) <= 0)
        assert len(set(lab[valid].tolist())) == valid.sum()
        assert np.all((sc[valid] > 0) & (sc[valid] <= 1)) and sc.sum() <= 1 + 1e-5


def test_one_row_at_a_time_equals_the_batch_also_from_several_threads(trained, problem):
    _, (X, _) = problem
    labels, scores = trained.predict(X, k=5, mode="index", probe=4)
    for i in range(0, X.shape[0], 37):
        li, si = trained.predict(X[i], k=5, mode="index", probe=4)
        np.testing.assert_array_equal(li[0], labels[i])
        np.testing.assert_allclose(si[0], scores[i], rtol=1e-6)
    errors = []

    def worker(offset):
        try:
            for i in range(offset, X.shape[0], 50):
                li, _ = trained.predict(X[i], k=5, mode="index", probe=4)
                if not np.array_equal(li[0], labels[i]):
                    errors.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(o,)) for o in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_index_follows_the_weights_through_training_loading_and_parameters(problem, tmp_path):
    train, (X, _) = problem
    net = Network(small_config(epochs=1), lr=0.02)
    net.fit(train)
    assert not net.index_info()["built"]
    first = net.predict(X, k=5, mode="index", probe=3)[0]
    info = net.index_info()
    assert info["built"] and info["build_seconds"] > 0
    assert net.index_info() == info                          # reused while the weights stand still
    np.testing.assert_array_equal(net.predict(X, k=5, mode="index", probe=3)[0], first)

    def fresh_copy(n):
        # The index of a network loaded from the same weights is built from them at its first
        # query: what a stale index would differ from.
        path = tmp_path / f"copy{n.step}.slide"
        n.save(path)
        return Network.load(path)

    net.fit(train, epochs=2)                                 # further training drops the index
    assert not net.index_info()["built"]
    after = net.predict(X, k=5, mode="index", probe=3)[0]
    assert not np.array_equal(after, first)
    copy = fresh_copy(net)
    assert not copy.index_info()["built"]                     # loading starts without one
    np.testing.assert_array_equal(copy.predict(X, k=5, mode="index", probe=3)[0],
                                  net.predict(X, k=5, mode="index", probe=3)[0])
    # Weights written through parameters(): the next query indexes the new rows.
    net.build_index()
    w = net.parameters()
    assert not net.index_info()["built"]
    last = max(k for k in w if k.endswith(".weight") and "adam" not in k)
    w[last][...] = w[last][::-1].copy()                      # labels swap their rows (and biases)
    bias = last.replace("weight", "bias")
    w[bias][...] = w[bias][::-1].copy()
    exact = net.predict(X, k=5, mode="exact")[0]
    clusters = net.build_index()["clusters"]
    np.testing.assert_array_equal(net.predict(X, k=5, mode="index", probe=clusters)[0], exact)
    swapped = net.predict(X, k=5, mode="index", probe=3)[0]
    np.testing.assert_array_equal(swapped, fresh_copy(net).predict(X, k=5, mode="index", probe=3)[0])


def test_bad_arguments_are_named(trained, problem):
    _, (X, Y) = problem
    with pytest.raises(ValueError, match="'exact', 'index', 'lsh'.*'fast'"):
        trained.predict(X, mode="fast")
    with pytest.raises(ValueError, match="evaluate: mode must be one of"):
        trained.evaluate((X, Y), mode="approx")
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(ValueError, match="probe must be an integer >= 1"):
            trained.predict(X, mode="index", probe=bad)
    with pytest.raises(ValueError, match="probe applies to mode='index' only"):
        trained.predict(X, mode="exact", probe=4)
    with pytest.raises(ValueError, match="probe applies to mode='index' only"):
        trained.predict(X, mode="lsh", probe=4)
    for name in ("candidates", "prior"):
        with pytest.raises(ValueError, match=f"{name} applies to mode='lsh' only"):
            trained.predict(X, mode="index", **{name: 10})
    with pytest.raises(ValueError, match="probe"):
        trained._core.predict_topk(*trained._query_arrays(X)[:3], 5, "index", probe=-2)
    with pytest.raises(ValueError, match="mode"):
        trained._core.predict_topk(*trained._query_arrays(X)[:3], 5, "ivf")
    assert PREDICT_MODES == ("exact", "index", "lsh")


def test_an_output_layer_on_the_input_has_nothing_to_index():
    X, Y = make_problem(n=200, num_features=100, num_labels=30, seed=1)
    net = Network({"layers": [{"activation": "softmax"}], "training": {"epochs": 1, "threads": 1}})
    net.fit((X, Y))
    with pytest.raises(ValueError, match="needs a hidden layer"):
        net.predict(X, mode="index")
    with pytest.raises(ValueError, match="needs a hidden layer"):
        net.build_index()
    assert net.predict(X, mode="exact")[0].shape == (200, 5)


def test_evaluate_and_the_cli_take_mode_index(trained, problem, tmp_path):
    from slide import cli

    _, (X, Y) = problem
    clusters = trained.build_index()["clusters"]
    assert trained.evaluate((X, Y), mode="index")["P@1"] >= trained.evaluate((X, Y))["P@1"] - 0.04
    assert cli._PREDICT_MODES == PREDICT_MODES
    model = tmp_path / "m.slide"
    trained.save(model)
    data = tmp_path / "test.txt"
    slide.Dataset(X, Y).save(data)
    out = tmp_path / "metrics.json"
    assert cli.main(["evaluate", str(model), str(data), "--mode", "index", "-o", str(out)]) == 0
    got = json.loads(out.read_text())
    ours = trained.evaluate((X, Y), mode="index")
    assert got["P@1"] == pytest.approx(ours["P@1"])
    assert clusters > 1

