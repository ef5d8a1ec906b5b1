"""predict(mode="lsh"): what a user serving queries relies on (format, agreement with exact
scoring, one row at a time equal to a batch, reused scratch) rather than timings, which
benchmarks/inference_latency.py measures."""
import threading

import numpy as np
import pytest

from slide.network import Network

from test_network import make_problem


@pytest.fixture(scope="module")
def trained():
    X, Y = make_problem(n=900, num_features=400, num_labels=120, seed=2)
    cfg = {"layers": [{"size": 32},
                      {"activation": "softmax", "sampling": "lsh",
                       "lsh": {"K": 2, "L": 8, "min_active": 8, "max_active": 40}}],
           "training": {"epochs": 4, "batch_size": 32, "threads": 2, "seed": 5, "rebuild_first": 5,
                        "dropout": 0.0}}
    net = Network(cfg, lr=0.02)
    net.fit((X[:700], Y[:700]))
    assert net.resolved_sampling[-1] == "lsh"
    return net, X[700:], Y[700:]


def check_format(labels, scores, n, k):
    assert labels.dtype == np.int32 and scores.dtype == np.float32
    assert labels.shape == scores.shape == (n, k)
    for lab, sc in zip(labels, scores):
        valid = lab >= 0
        # Scored labels first, then -1 with score 0 when fewer than k labels were scored.
        assert not np.any(valid[1:] & ~valid[:-1])
        assert np.all(sc[~valid] == 0)
        assert len(set(lab[valid].tolist())) == valid.sum()
        assert np.all(np.diff(sc[valid]) <= 0)
        assert np.all((sc[valid] > 0) & (sc[valid] <= 1)) and sc.sum() <= 1 + 1e-5


def test_lsh_predictions_have_the_documented_format(trained):
    net, X, _ = trained
    for kw in ({}, {"prior": 0}, {"candidates": 0, "prior": 0}, {"candidates": 5, "prior": 3}):
        labels, scores = net.predict(X, k=7, mode="lsh", **kw)
        check_format(labels, scores, X.shape[0], 7)
    # A budget of 5 hash candidates and 3 prior labels scores at most 8 labels per row.
    labels, _ = net.predict(X, k=10, mode="lsh", candidates=5, prior=3)
    assert np.all((labels[:, 8:] == -1))


def test_lsh_scoring_every_label_equals_exact(trained):
    net, X, _ = trained
    exact_l, exact_s = net.predict(X, k=5, mode="exact")
    lsh_l, lsh_s = net.predict(X, k=5, mode="lsh", prior=net.num_labels)
    np.testing.assert_array_equal(lsh_l, exact_l)
    np.testing.assert_allclose(lsh_s, exact_s, rtol=1e-5)


def test_lsh_agrees_with_exact_on_an_easy_problem(trained):
    net, X, Y = trained
    exact = net.predict(X, k=1, mode="exact")[0][:, 0]
    hashed = net.predict(X, k=1, mode="lsh", prior=0)[0][:, 0]   # hash candidates alone
    with_prior = net.predict(X, k=1, mode="lsh", prior=20)[0][:, 0]
    # Tiny tables (K=2, L=8 over 120 labels, hidden 32) find the exact top label for ~71% of
    # the rows here; the 20 labels of largest bias add a few more.
    assert np.mean(hashed == exact) >= 0.6
    assert np.mean(with_prior == exact) >= np.mean(hashed == exact)
    p1 = lambda top: np.mean([Y[i, t] != 0 for i, t in enumerate(top)])
    assert p1(exact) >= 0.8 and p1(with_prior) >= p1(exact) - 0.25


def test_one_row_at_a_time_equals_the_batch(trained):
    net, X, _ = trained
    labels, scores = net.predict(X, k=5, mode="lsh")
    for i in range(0, X.shape[0], 13):
        li, si = net.predict(X[i], k=5, mode="lsh")
        np.testing.assert_array_equal(li[0], labels[i])
        np.testing.assert_array_equal(si[0], scores[i])
    # Reused prediction scratch: many single queries from several threads at once agree too.
    errors = []

    def serve(rows):
        for i in rows:
            li, _ = net.predict(X[i], k=5, mode="lsh")
            if not np.array_equal(li[0], labels[i]):
                errors.append(i)

    threads = [threading.Thread(target=serve, args=(range(t, X.shape[0], 3),)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("kw, name", [({"candidates": -1}, "candidates"), ({"prior": 1.5}, "prior"),
                                      ({"prior": True}, "prior"), ({"candidates": "10"}, "candidates")])
def test_bad_query_settings_name_the_argument(trained, kw, name):
    net, X, _ = trained
    with pytest.raises(ValueError, match=f"predict: {name} must be"):
        net.predict(X, mode="lsh", **kw)


def test_lsh_mode_on_a_dense_output_layer_is_exact():
    X, Y = make_problem(n=300)
    net = Network(hidden=16, epochs=1, threads=1, seed=0, sampling="dense")
    net.fit((X, Y))
    a, b = net.predict(X, k=3, mode="exact"), net.predict(X, k=3, mode="lsh")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("normalize", ["none", "l2", "tfidf_l2"])
def test_query_scaling_is_the_training_scaling(normalize):
    """predict scales rows without building matrices; the values must be those of fit's path."""
    X, Y = make_problem(n=200)
    X = X.multiply(np.random.default_rng(0).random(X.shape)).tocsr().astype(np.float32)
    net = Network(hidden=8, epochs=1, threads=1, seed=0, normalize=normalize)
    net.fit((X, Y))
    q, ref = net._query_arrays(X), net._convert(X, None)
    for name in ("x_indptr", "x_indices", "x_values"):
        got, want = getattr(q, name), getattr(ref, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    before = X.data.copy()
    net.predict(X, k=2)
    np.testing.assert_array_equal(X.data, before)   # the caller's matrix is left as it was
