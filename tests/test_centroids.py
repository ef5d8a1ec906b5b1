"""The label-centroid term of the output layer (slide.centroids, layers[-1].centroid_weight):
the centroids, the mixed ranking against a direct computation, the choice of the weight on
validation data, the configuration and the network file."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import centroids
from slide.config import Config, ConfigError

from conftest import dataset_dir, load_split, run_cli


def _problem(n=600, d=300, L=40, seed=0):
    """Points near one of L prototypes, each labelled with its prototype (and a second label
    now and then): a nearest-centroid rule does well, the network needs training."""
    rng = np.random.default_rng(seed)
    protos = [rng.choice(d, 12, replace=False) for _ in range(L)]
    rows, cols, vals, ylab = [], [], [], []
    for i in range(n):
        c = int(rng.integers(L))
        feats = np.unique(np.concatenate([rng.choice(protos[c], 8, replace=False), rng.choice(d, 4)]))
        rows += [i] * len(feats)
        cols += feats.tolist()
        vals += rng.uniform(0.5, 1.5, len(feats)).tolist()
        ylab.append([c] + ([int(rng.integers(L))] if rng.random() < 0.2 else []))
    X = sp.csr_matrix((np.array(vals, np.float32), (rows, cols)), shape=(n, d))
    Y = sp.lil_matrix((n, L), dtype=np.float32)
    for i, ls in enumerate(ylab):
        for lab in ls:
            Y[i, lab] = 1
    return X, Y.tocsr()


def _dense_centroids(X, Y):
    Xn = X.toarray().astype(np.float64)
    Xn /= np.maximum(np.linalg.norm(Xn, axis=1, keepdims=True), 1e-30)
    C = Y.toarray().T @ Xn
    norms = np.linalg.norm(C, axis=1, keepdims=True)
    return np.where(norms > 0, C / np.where(norms > 0, norms, 1), 0.0), Xn


def test_centroids_are_the_normalised_sums_of_the_normalised_rows():
    X, Y = _problem()
    Y = Y.tolil()
    Y[:, 7] = 0          # a label without points: a zero centroid
    Y = Y.tocsr()
    Y.eliminate_zeros()
    CT = centroids.build(np.asarray(X.indptr, np.int64), X.indices.astype(np.int32), X.data, np.asarray(Y.indptr, np.int64),
                         Y.indices.astype(np.int32), X.shape[1], Y.shape[1])
    want, _ = _dense_centroids(X, Y)
    assert CT.shape == (X.shape[1], Y.shape[1]) and CT.dtype == np.float32
    np.testing.assert_allclose(CT.toarray().T, want, atol=1e-6)
    assert CT[:, 7].nnz == 0


def test_centroids_built_in_blocks_equal_one_block(monkeypatch):
    X, Y = _problem(seed=3)
    args = (np.asarray(X.indptr, np.int64), X.indices.astype(np.int32), X.data, np.asarray(Y.indptr, np.int64),
            Y.indices.astype(np.int32), X.shape[1], Y.shape[1])
    one = centroids.build(*args)
    monkeypatch.setattr(centroids, "_BUILD_BLOCK", 50)   # about one label a block
    many = centroids.build(*args)
    np.testing.assert_allclose(many.toarray(), one.toarray(), atol=1e-7)


def _mixed_reference(net, X, CT, weight, k):
    """z + weight * cos(x, c_l) for every label, from the parameters (one hidden ReLU layer)."""
    p = net.parameters()
    Xs = slide.scaling.normalize_rows(X, net.config.data.normalize)
    H = np.maximum(Xs @ p["layers.0.weight"] + p["layers.0.bias"], 0)
    Z = H @ p["layers.1.weight"].T + p["layers.1.bias"]
    Xn = Xs.toarray() / np.maximum(np.linalg.norm(Xs.toarray(), axis=1, keepdims=True), 1e-30)
    M = Z + weight * (Xn @ (CT if isinstance(CT, np.ndarray) else CT.toarray()))
    return np.argsort(-M, axis=1, kind="stable")[:, :k], M


@pytest.mark.parametrize("activation", ["sigmoid", "softmax"])
def test_an_explicit_weight_ranks_by_logit_plus_weighted_cosine(activation):
    X, Y = _problem(seed=1)
    cfg = {"layers": [{"size": 32}, {"size": None, "activation": activation, "centroid_weight": 3.0}]}
    net = slide.Network(cfg, epochs=2, threads=1, seed=3)
    h = net.fit((X, Y))
    assert h.centroid_weight == 3.0 and h.centroid_search == {}
    CT = net._centroids
    want, M = _mixed_reference(net, X[:50], CT, 3.0, 5)
    labels, scores = net.predict(X[:50], k=5)
    np.testing.assert_array_equal(labels, want)
    # one row at a time (the scores gathered without a sparse product): the same ranking
    np.testing.assert_array_equal(np.vstack([net.predict(X[i], k=5)[0] for i in range(6)]), want[:6])
    top = np.take_along_axis(M, want, axis=1)
    if activation == "sigmoid":
        np.testing.assert_allclose(scores, 1 / (1 + np.exp(-top)), rtol=1e-4)
    else:
        e = np.exp(M - M.max(axis=1, keepdims=True))
        np.testing.assert_allclose(scores, np.take_along_axis(e / e.sum(axis=1, keepdims=True), want, axis=1),
                                   rtol=1e-4, atol=1e-7)
    # a weight of 0 is the network alone: the engine's own ranking
    net._centroid_weight = 0.0
    alone, _ = net.predict(X[:50], k=5)
    lab0, _ = net._core.predict_topk(*(lambda a: (a.x_indptr, a.x_indices, a.x_values))(
        net._query_arrays(X[:50].tocsr())), 5)
    np.testing.assert_array_equal(alone, lab0)


@pytest.mark.parametrize("activation", ["sigmoid", "softmax"])
def test_a_wide_layer_reranks_the_pools_of_network_and_centroids(monkeypatch, activation):
    """Above FULL_LABELS the labels scored are the two top-POOL pools; when the pools hold every
    label that is the full ranking, and with small pools the top labels still come from them."""
    X, Y = _problem(seed=2, L=60)
    net = slide.Network({"layers": [{"size": 32}, {"size": None, "activation": activation, "centroid_weight": 2.0}]},
                        epochs=2, threads=1)
    net.fit((X, Y))
    full, full_scores = net.predict(X[:80], k=5)
    monkeypatch.setattr(centroids, "FULL_LABELS", 10)
    monkeypatch.setattr(centroids, "POOL", 60)
    pooled, pooled_scores = net.predict(X[:80], k=5)
    np.testing.assert_array_equal(pooled, full)
    np.testing.assert_allclose(pooled_scores, full_scores, rtol=1e-5, atol=1e-8)
    valid = net._convert(X[:80].tocsr(), Y[:80].tocsr())
    chosen_from_pools = centroids.choose_weight(net, valid, net._centroids)
    monkeypatch.setattr(centroids, "FULL_LABELS", 4096)
    assert chosen_from_pools == centroids.choose_weight(net, valid, net._centroids)
    monkeypatch.setattr(centroids, "FULL_LABELS", 10)
    monkeypatch.setattr(centroids, "POOL", 8)
    small, _ = net.predict(X[:80], k=5)
    assert (small[:, 0] == full[:, 0]).mean() > 0.95
    for mode in ("index", "exact"):
        labels, scores = net.predict(X[:20], k=3, mode=mode)
        assert labels.shape == (20, 3) and np.all(labels >= 0) and np.all(np.diff(scores, axis=1) <= 0)


def _grid(kind):
    return [0.0, *(centroids.RIDGE_WEIGHTS if kind == "ridge" else centroids.WEIGHTS)]


def test_auto_chooses_on_validation_and_the_file_keeps_it(tmp_path):
    """medical (333 training points): a linear part helps a network trained on few points;
    auto picks ridge label vectors and a weight above 0 on the search's validation split, and
    the test P@1 of the mix is at least the network's alone. Measured (2 threads): ridge, lambda
    0.3, weight 256, test P@1 0.8496 (centroids, weight 4: 0.8310; the network alone 0.8217)."""
    train, test = load_split("medical")
    net = slide.Network(threads=1, ensemble=1)   # one network's choice (tests/test_ensemble.py: three)
    h = net.fit(train)
    assert h.centroid_kind == net.centroid_kind == "ridge" and net._ridge_lambda in centroids.RIDGE_LAMBDAS
    assert list(h.centroid_search) == _grid("ridge")
    assert h.centroid_weight in centroids.RIDGE_WEIGHTS
    assert h.centroid_search[h.centroid_weight] > h.centroid_search[0.0]
    # chosen on the search's best epoch (of the rate lr_search kept): without the term, its
    # validation P@1 is the best the search recorded
    assert h.centroid_search[0.0] == pytest.approx(h.best_score)
    mixed = net.evaluate(test)["P@1"]
    net.save(tmp_path / "m.npz")
    net._centroid_weight = 0.0
    alone = net.evaluate(test)["P@1"]
    assert mixed >= alone - 0.005 and mixed >= 0.83
    loaded = slide.Network.load(tmp_path / "m.npz")
    assert loaded._centroid_weight == h.centroid_weight
    assert (loaded.centroid_kind, loaded._ridge_lambda) == ("ridge", net._ridge_lambda)
    assert loaded.evaluate(test)["P@1"] == mixed


def test_auto_without_validation_data_is_off():
    X, Y = _problem(seed=4)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto"}]}, epochs=1, threads=1)
    h = net.fit((X, Y))
    assert h.centroid_weight == 0.0 and net._centroids is None


def test_auto_with_a_count_of_epochs_chooses_at_the_end_on_valid():
    X, Y = _problem(seed=5)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto"}]}, epochs=2, threads=1)
    h = net.fit((X[:500], Y[:500]), valid=(X[500:], Y[500:]))
    p1 = h.centroid_search
    assert list(p1) == _grid(net.centroid_kind)
    # the rule: the best P@1, ties to the smaller weight, and above 0 only when one more of the
    # 100 validation points is right than without the term
    best = max(p1, key=lambda w: (p1[w], -w))
    want = best if p1[best] >= p1[0.0] + 0.01 - 1e-9 else 0.0
    assert h.centroid_weight == want
    assert (net._centroids is not None) == (want > 0)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"layers\.1\.centroid_weight: must be >= 0"):
        Config.from_dict({"layers": [{"size": 8}, {"size": None, "activation": "auto", "centroid_weight": -1}]})
    with pytest.raises(ConfigError, match=r"layers\.1\.centroid_weight: expected a number or auto"):
        Config.from_dict({"layers": [{"size": 8}, {"size": None, "activation": "auto", "centroid_weight": "on"}]})
    with pytest.raises(ConfigError, match=r"layers\.0\.centroid_weight: the label-centroid term belongs to the last"):
        Config.from_dict({"layers": [{"size": 8, "centroid_weight": 2}, {"size": None, "activation": "auto"}]})


def test_a_file_with_a_weight_but_no_centroids_is_refused(tmp_path):
    X, Y = _problem(seed=6)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 1.5}]},
                        epochs=1, threads=1)
    net.fit((X, Y))
    path = tmp_path / "net.npz"
    net.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("centroids/")}
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match=r"bad\.npz: centroid_weight is 1\.5 but the centroids are missing"):
        slide.Network.load(bad)


def test_max_features_keeps_each_centroids_largest_entries_at_unit_length():
    X, Y = _problem(seed=7)
    args = (np.asarray(X.indptr, np.int64), X.indices.astype(np.int32), X.data, np.asarray(Y.indptr, np.int64),
            Y.indices.astype(np.int32), X.shape[1], Y.shape[1])
    full = centroids.build(*args).toarray().T
    pruned = centroids.build(*args, max_features=3).toarray().T
    for row, want in zip(pruned, full):
        kept = np.flatnonzero(row)
        assert len(kept) == min(3, np.count_nonzero(want))
        assert set(kept) == set(np.argsort(-want)[:len(kept)])
        np.testing.assert_allclose(row[kept], want[kept] / np.linalg.norm(want[kept]), rtol=1e-5)


@pytest.mark.slow   # a subprocess
def test_slide_train_prints_and_records_the_weight(tmp_path):
    d = dataset_dir("medical")
    cfg = Config()
    cfg.data.train, cfg.data.test = str(d / "train.txt"), str(d / "test.txt")
    cfg.training.threads = 1
    path = tmp_path / "medical.yaml"
    path.write_text(cfg.to_yaml())
    p = run_cli("train", path, "--out", tmp_path / "run", "--quiet")
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["centroid_kind"] == "ridge"   # medical: ridge wins on validation (lambda 0.3 measured)
    assert list(summary["centroid_search"]) == [str(w) for w in _grid("ridge")]   # the first network's
    # medical is cheap: three networks (slide.ensemble), each choosing its weight; the merged
    # network's is their mean (all three chose ridge vectors of the same penalty)
    members = summary["ensemble"]
    assert [m["seed"] for m in members] == [0, 1000, 2000]
    assert all(m["centroid_weight"] in centroids.RIDGE_WEIGHTS and m["centroid_kind"] == "ridge" for m in members)
    w, lam = summary["centroid_weight"], summary["ridge_lambda"]
    assert w == pytest.approx(sum(m["centroid_weight"] for m in members) / 3) and lam in centroids.RIDGE_LAMBDAS
    assert f"label-centroid weight {w:g} on ridge label vectors (lambda {lam:g}) (by validation)" in p.stdout
    assert "3 networks merged (seeds 0, 1000, 2000; best epochs " in p.stdout
    loaded = slide.Network.load(tmp_path / "run" / "model.slide")
    assert loaded._centroid_weight == w and loaded._centroids is not None


@pytest.mark.parametrize("layers", [
    [{"size": None, "activation": "sigmoid"}],                                         # reads the input
    [{"size": 16, "precision": "bf16"}, {"size": None, "activation": "sigmoid", "precision": "bf16"}],
])
def test_label_logits_are_the_logits_prediction_ranks_by(layers):
    X, Y = _problem(seed=8)
    layers[-1] = dict(layers[-1], centroid_weight=0)
    net = slide.Network({"layers": layers}, epochs=1, threads=1)
    net.fit((X, Y))
    q = net._query_arrays(X[:30].tocsr())
    L = net.num_labels
    z = net._core.label_logits(q.x_indptr, q.x_indices, q.x_values, np.arange(31, dtype=np.int64) * L,
                               np.tile(np.arange(L, dtype=np.int32), 30)).reshape(30, L)
    labels, scores = net.predict(X[:30], k=4)
    np.testing.assert_array_equal(labels, np.argsort(-z, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-np.take_along_axis(z, labels, axis=1))), rtol=1e-5)
    with pytest.raises(ValueError, match=r"cand: label 40 is outside \[0, 40\)"):
        net._core.label_logits(q.x_indptr[:2], q.x_indices, q.x_values, np.array([0, 1], np.int64),
                               np.array([L], np.int32))


def test_the_pools_of_a_wide_layer_are_each_rows_best_term_labels_and_the_networks():
    """slide._core.label_pools: per row, the union of the `pool` best labels by the term (the CSR
    product of the unit rows with the label vectors, the same float32 sums; ties to the lower id,
    a zero sum is no score) and the network's labels (-1 = none), ascending, with their scores."""
    from slide import _core
    from slide.scaling import normalize_rows

    rng = np.random.default_rng(9)
    X, Y = _problem(seed=9)
    CT = centroids.build(np.asarray(X.indptr, np.int64), X.indices.astype(np.int32), X.data,
                         np.asarray(Y.indptr, np.int64), Y.indices.astype(np.int32), X.shape[1], Y.shape[1])
    CT.data = np.round(CT.data * 4) / 4          # many equal scores, some exactly zero sums
    Q = X[:40].tolil()
    Q[3, :] = 0                                   # an empty row
    Q = normalize_rows(Q.tocsr().astype(np.float32), "l2")
    L = CT.shape[1]
    top = rng.integers(-1, L, size=(40, 3)).astype(np.int32)
    S = (Q @ CT).toarray()
    for pool in (0, 2, 5, L):
        args = (np.asarray(Q.indptr, np.int64), Q.indices.astype(np.int32), Q.data, np.asarray(CT.indptr, np.int64),
                CT.indices.astype(np.int32), CT.data.astype(np.float32), L, top, pool)
        ip, labels, scores = _core.label_pools(*args, threads=2)
        for i in range(40):
            scored = [l for l in range(L) if S[i, l] != 0]
            best = sorted(scored, key=lambda l: (-S[i, l], l))[:pool]
            want = sorted(set(best) | {int(t) for t in top[i] if t >= 0})
            assert labels[ip[i]:ip[i + 1]].tolist() == want, (pool, i)
            np.testing.assert_array_equal(scores[ip[i]:ip[i + 1]], S[i, want].astype(np.float32))
        one = _core.label_pools(*args, threads=1)
        for a, b in zip(one, (ip, labels, scores)):
            np.testing.assert_array_equal(a, b)
    assert ip[4] - ip[3] == len({int(t) for t in top[3] if t >= 0})   # the empty row: the network's labels
    bad_top = top.copy()
    bad_top[0, 0] = L
    with pytest.raises(ValueError, match="top label"):
        _core.label_pools(*args[:7], bad_top, 2)
    # a label vector naming a label past the layer (ids are checked as the rows read them)
    q = (np.array([0, 1], np.int64), np.array([0], np.int32), np.array([1.0], np.float32))
    ct = (np.array([0, 2], np.int64), np.array([1, 7], np.int32), np.array([0.5, 0.5], np.float32))
    with pytest.raises(ValueError, match="label_pools: label 7 is outside"):
        _core.label_pools(*q, *ct, 5, np.full((1, 1), -1, np.int32), 2)
    ip, labels, scores = _core.label_pools(*q, *ct, 8, np.full((1, 1), -1, np.int32), 2)   # and afterwards
    assert labels.tolist() == [1, 7] and scores.tolist() == [0.5, 0.5]


def test_the_weight_can_be_set_for_serving():
    X, Y = _problem(seed=10)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 4.0}]},
                        epochs=1, threads=1)
    net.fit((X, Y))
    assert net.centroid_weight == 4.0
    mixed, _ = net.predict(X[:20], k=3)
    net.centroid_weight = 0
    alone, _ = net.predict(X[:20], k=3)
    q = net._query_arrays(X[:20].tocsr())
    np.testing.assert_array_equal(alone, net._core.predict_topk(q.x_indptr, q.x_indices, q.x_values, 3)[0])
    net.centroid_weight = 4
    np.testing.assert_array_equal(net.predict(X[:20], k=3)[0], mixed)
    for bad in (-1, float("nan"), "2", True):
        with pytest.raises(ValueError, match="centroid_weight: expected a number >= 0"):
            net.centroid_weight = bad
    off = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 0}]},
                        epochs=1, threads=1)
    off.fit((X, Y))
    with pytest.raises(ValueError, match="this network has no label centroids"):
        off.centroid_weight = 2.0


def test_the_memory_estimate_bounds_the_centroids_of_a_wide_layer():
    import os

    cfg = Config.from_yaml(os.path.join(os.path.dirname(__file__), "..", "datasets", "synth-amazon-670k.yaml"))
    assert cfg.layers[-1].centroid_weight == 32.0
    est = slide.memory.estimate(cfg, 135_909, 670_091)
    threads = cfg.training.threads or slide._core.default_threads()
    # 172 MB of centroids, and each thread's scratch of a float and a byte a label (3.4 MB)
    assert est["centroids"] == 670_091 * centroids.MAX_FEATURES * 8 + 135_910 * 8 + threads * 670_091 * 5
    cfg.layers[-1].centroid_weight = 0.0
    assert slide.memory.estimate(cfg, 135_909, 670_091)["centroids"] == 0
    # a wide network's centroids stay within the bound
    X, Y = _problem(n=400, d=300, L=5000, seed=11)
    net = slide.Network({"layers": [{"size": 8}, {"size": None, "activation": "auto", "sampling": "dense",
                                                  "centroid_weight": 1.0}]}, epochs=1, threads=1)
    net.fit((X, Y))
    CT = net._centroids
    assert np.diff(CT.T.tocsr().indptr).max() <= centroids.MAX_FEATURES
    est = slide.memory.estimate(net.config, 300, 5000)
    assert CT.data.nbytes + CT.indices.nbytes + CT.indptr.nbytes <= est["centroids"]


def test_an_interrupted_auto_search_resumes_to_the_same_choice(tmp_path):
    """The choice of the search's best epoch so far is part of a checkpoint: a search stopped
    after its best epoch and resumed chooses as the uninterrupted one."""
    from slide import callbacks

    X, Y = _problem(seed=12)
    make = lambda: slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto"}],  # noqa: E731
                                  "optimizer": {"lr_search": []}},
                                 threads=1, batch_size=32, max_epochs=12, patience=3)
    full = make()
    h = full.fit((X, Y))
    best_step = h.best_step
    part = make()
    part.fit((X, Y), callbacks=[callbacks.StopAfter(best_step + 3)])
    assert part._best_choice is not None and part._phase == "search"
    part.save(tmp_path / "part.npz")
    resumed = slide.Network.load(tmp_path / "part.npz")
    assert resumed._best_choice == part._best_choice
    h2 = resumed.fit((X, Y))
    assert (h2.centroid_weight, h2.centroid_search, h2.centroid_kind) == (
        h.centroid_weight, h.centroid_search, h.centroid_kind)
    np.testing.assert_array_equal(resumed.predict(X[:40], k=3)[0], full.predict(X[:40], k=3)[0])


def test_all_logits_are_label_logits_of_every_label():
    X, Y = _problem(seed=13)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 0}]},
                        epochs=1, threads=1)
    net.fit((X, Y))
    q = net._query_arrays(X[:25].tocsr())
    L = net.num_labels
    every = net._core.all_logits(q.x_indptr, q.x_indices, q.x_values)
    chosen = net._core.label_logits(q.x_indptr, q.x_indices, q.x_values, np.arange(26, dtype=np.int64) * L,
                                    np.tile(np.arange(L, dtype=np.int32), 25)).reshape(25, L)
    assert every.shape == (25, L)
    np.testing.assert_allclose(every, chosen, rtol=1e-5, atol=1e-5)
    lsh = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "softmax", "sampling": "lsh",
                                                   "centroid_weight": 0}]}, epochs=1, threads=1)
    lsh.fit((X, Y))
    assert lsh._core.all_logits(q.x_indptr, q.x_indices, q.x_values) is None   # no batched path: label_logits


@pytest.mark.parametrize("n,d", [(300, 800), (900, 200)])   # solved in the points' space, the features'
def test_ridge_vectors_solve_the_penalised_least_squares(n, d):
    X = sp.random(n, d, density=0.05, format="csr", dtype=np.float32, random_state=1)
    Y = sp.random(n, 7, density=0.3, format="csr", dtype=np.float32, random_state=2)
    Y.data[:] = 1
    W = centroids.build_ridge(np.asarray(X.indptr, np.int64), X.indices, X.data, np.asarray(Y.indptr, np.int64),
                              Y.indices, d, 7, (0.1, 1.0))
    Xn = X.toarray().astype(np.float64)
    norms = np.linalg.norm(Xn, axis=1, keepdims=True)
    Xn /= np.where(norms > 0, norms, 1)
    for lam in (0.1, 1.0):
        want = np.linalg.solve(Xn.T @ Xn + lam * np.eye(d), Xn.T @ Y.toarray())
        assert W[lam].shape == (d, 7) and W[lam].dtype == np.float32
        np.testing.assert_allclose(W[lam], want, atol=1e-5)


def test_ridge_with_a_set_weight_ranks_by_logit_plus_weighted_ridge_score(tmp_path):
    X, Y = _problem(seed=8)
    cfg = {"layers": [{"size": 32}, {"size": None, "activation": "sigmoid", "centroid_weight": 2.0,
                                     "centroid_kind": "ridge"}]}
    net = slide.Network(cfg, epochs=2, threads=1, seed=3)
    net.fit((X, Y))
    assert net.centroid_kind == "ridge" and net._ridge_lambda == centroids.RIDGE_DEFAULT_LAMBDA
    W = centroids.build_ridge(*(lambda a: (a.x_indptr, a.x_indices, a.x_values, a.y_indptr, a.y_indices))(
        net._convert(X, Y)), X.shape[1], Y.shape[1], (centroids.RIDGE_DEFAULT_LAMBDA,))
    np.testing.assert_array_equal(net._centroids, W[centroids.RIDGE_DEFAULT_LAMBDA])
    want, _ = _mixed_reference(net, X[:50], net._centroids, 2.0, 5)
    labels, _ = net.predict(X[:50], k=5)
    np.testing.assert_array_equal(labels, want)
    np.testing.assert_array_equal(np.vstack([net.predict(X[i], k=5)[0] for i in range(4)]), want[:4])
    net.save(tmp_path / "r.npz")
    loaded = slide.Network.load(tmp_path / "r.npz")
    assert (loaded.centroid_kind, loaded._ridge_lambda, loaded.centroid_weight) == ("ridge", 0.3, 2.0)
    np.testing.assert_array_equal(loaded.predict(X[:50], k=5)[0], labels)


def test_centroid_kind_mean_tries_no_ridge_and_auto_with_a_set_weight_means_mean():
    X, Y = _problem(seed=9)
    layers = [{"size": 16}, {"size": None, "activation": "auto", "centroid_kind": "mean"}]
    net = slide.Network({"layers": layers}, epochs=2, threads=1)
    h = net.fit((X[:500], Y[:500]), valid=(X[500:], Y[500:]))
    assert list(h.centroid_search) == _grid("mean") and net._ridge is None
    assert net.centroid_kind == "mean" and h.centroid_kind in (None, "mean")
    set_weight = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 1}]},
                               epochs=1, threads=1)
    set_weight.fit((X, Y))
    assert set_weight.centroid_kind == "mean" and sp.issparse(set_weight._centroids)


def test_ridge_on_a_problem_too_large_is_refused_by_name():
    X, Y = _problem(seed=10, n=60)
    Y = sp.csr_matrix((Y.data, Y.indices, Y.indptr), shape=(60, centroids.FULL_LABELS + 1))
    net = slide.Network({"layers": [{"size": 8}, {"size": None, "activation": "sigmoid", "centroid_weight": 1,
                                                  "centroid_kind": "ridge"}]}, epochs=1, threads=1)
    with pytest.raises(ConfigError, match=r"layers\.1\.centroid_kind: ridge label vectors need at most 4096 labels"
                                          r".*60 points, 300 features and 4097 labels: use mean or auto"):
        net.fit((X, Y))
    with pytest.raises(ConfigError, match=r"layers\.0\.centroid_kind: the label-centroid term belongs to the last"):
        Config.from_dict({"layers": [{"size": 8, "centroid_kind": "ridge"}, {"size": None, "activation": "auto"}]})
    with pytest.raises(ConfigError, match=r"layers\.1\.centroid_kind"):
        Config.from_dict({"layers": [{"size": 8}, {"size": None, "activation": "auto", "centroid_kind": "lasso"}]})


def test_a_file_from_before_centroid_kind_loads_as_centroids(tmp_path):
    X, Y = _problem(seed=11)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto", "centroid_weight": 1.5}]},
                        epochs=1, threads=1)
    net.fit((X, Y))
    net.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    del meta["centroid_kind"], meta["ridge_lambda"]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", **arrays)
    old = slide.Network.load(tmp_path / "old.npz")
    assert old.centroid_kind == "mean" and old.centroid_weight == 1.5
    np.testing.assert_array_equal(old.predict(X[:30], k=3)[0], net.predict(X[:30], k=3)[0])
    meta["centroid_kind"] = "ridge"
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"bad\.npz: centroid_kind must be mean, mixed, or ridge with a ridge_lambda > 0"):
        slide.Network.load(tmp_path / "bad.npz")


@pytest.mark.parametrize("gained,lost,replaced", [(8, 4, True), (5, 3, False), (1, 0, True), (0, 0, False)])
def test_ridge_replaces_the_centroids_by_one_standard_error_of_the_paired_difference(monkeypatch, gained, lost,
                                                                                        replaced):
    """choose: the ridge option must be right on b rows where the centroids' choice is wrong and
    wrong on c where it is right with b - c >= max(1, sqrt(b + c)): +2 rows of 8 that differ stay
    with the centroids, +4 of 12 switch."""
    from types import SimpleNamespace

    n = 100
    mean = np.zeros((len(centroids.WEIGHTS) + 1, n), dtype=bool)
    mean[:, :50] = True                      # 50 right at every weight: weight 0 is kept
    ridge = np.zeros((len(centroids.RIDGE_WEIGHTS) + 1, n), dtype=bool)
    ridge[:, :50] = True
    ridge[3, 50:50 + gained] = True          # weight RIDGE_WEIGHTS[2]: gains some rows, loses others
    ridge[3, :lost] = False
    grids = [[0.0, *centroids.WEIGHTS], [0.0, *centroids.RIDGE_WEIGHTS]]
    monkeypatch.setattr(centroids, "_hits_full", lambda net, valid, cands: list(zip(grids, [mean, ridge])))
    got = centroids.choose(SimpleNamespace(num_labels=10), SimpleNamespace(n=n),
                           [("mean", None, None), ("ridge", 0.3, None)])
    if replaced and gained > lost:
        assert (got.kind, got.lam, got.weight) == ("ridge", 0.3, centroids.RIDGE_WEIGHTS[2])
        assert got.p1[got.weight] == (50 + gained - lost) / n
    else:
        assert (got.kind, got.weight) == ("mean", 0.0) and got.p1[0.0] == 0.5


def test_the_memory_estimate_bounds_the_ridge_label_vectors_and_names_the_setting_that_saves_them():
    X, Y = _problem(seed=12, n=500, d=300, L=40)
    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "auto"}]}, epochs=2, threads=1)
    net.fit((X[:400], Y[:400]), valid=(X[400:], Y[400:]))
    assert list(net.history.centroid_search) in (_grid("mean"), _grid("ridge"))
    est = slide.memory.estimate(net.config, 300, 40, num_points=400)
    Xf, Yf = X[:400].tocsr(), Y[:400].tocsr()
    ridge = centroids.build_ridge(np.asarray(Xf.indptr, np.int64), Xf.indices, Xf.data.astype(np.float32),
                                  np.asarray(Yf.indptr, np.int64), Yf.indices, 300, 40)
    assert len(ridge) == len(centroids.RIDGE_LAMBDAS)
    built = sum(W.nbytes for W in ridge.values())
    gram = 300 * 300 * 4     # min(points, features) squared, float32
    assert built + 2 * gram <= est["label_vectors"] <= 2 * (built + 2 * gram) + 500 * 40 * 4 * 5
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    # no ridge vectors: the term off, the centroids asked for, a set weight (means mean), or a
    # problem outside the gate of centroid_kind auto
    cfg = net.config.copy()
    for weight, kind in ((0.0, "auto"), ("auto", "mean"), (2.0, "auto")):
        cfg.layers[-1].centroid_weight, cfg.layers[-1].centroid_kind = weight, kind
        assert slide.memory.estimate(cfg, 300, 40, num_points=400)["label_vectors"] == 0
    cfg.layers[-1].centroid_weight, cfg.layers[-1].centroid_kind = "auto", "auto"
    assert slide.memory.estimate(cfg, 300, centroids.FULL_LABELS + 1)["label_vectors"] == 0
    # without the number of points, the largest problem the gate admits: a 6,000-square Gram matrix
    assert slide.memory.estimate(cfg, 50_000, 600)["label_vectors"] >= 2 * 6000 ** 2 * 4 + 4 * 50_000 * 600 * 4
    with pytest.raises(MemoryError, match=r"label_vectors .*layers\.1\.centroid_kind: mean saves the label vectors"):
        slide.memory.check_fits(cfg, 50_000, 600, available=400 << 20)


def test_top_k_of_a_full_layer_is_the_stable_descending_sort_ties_and_nan_included():
    rng = np.random.default_rng(5)
    M = rng.integers(0, 6, size=(40, 30)).astype(np.float64)    # many ties, at the k-th value too
    M[7] = np.nan
    M[8, :] = 2.0
    M[9, 3] = np.nan
    for k in (2, 5, 29, 30):
        want = np.argsort(-M, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(centroids._top_sorted(M, k), want)


def test_a_narrow_layer_scores_the_centroids_through_a_dense_copy_with_the_same_ranking(monkeypatch):
    X, Y = _problem(seed=4)
    net = slide.Network({"layers": [{"size": 32}, {"size": None, "activation": "auto", "centroid_weight": 3.0}]},
                        epochs=2, threads=1, seed=3)
    net.fit((X, Y))
    assert centroids.dense_scoring(300, 40)
    labels, scores = net.predict(X[:80], k=5)
    CT, (kept, D) = net._centroids, net._dense_vectors
    assert kept is CT and isinstance(D, np.ndarray) and D.shape == (300, 40)
    np.testing.assert_array_equal(D, CT.toarray())
    net.predict(X[:10], k=5)
    assert net._dense_vectors[1] is D                            # kept for the same centroids
    monkeypatch.setattr(centroids, "DENSE_MAX_ENTRIES", 0)       # the sparse product instead
    net._dense_vectors = None
    sparse_labels, sparse_scores = net.predict(X[:80], k=5)
    assert net._dense_vectors is None
    np.testing.assert_array_equal(labels, sparse_labels)
    np.testing.assert_allclose(scores, sparse_scores, rtol=1e-6)


def test_the_memory_estimate_counts_the_dense_scoring_copy_of_a_narrow_layer():
    cfg = Config.from_dict({"layers": [{"size": 32}, {"size": None, "centroid_weight": 2.0, "centroid_kind": "mean"}]})
    assert slide.memory.estimate(cfg, 5000, 4000)["centroids"] == 5000 * 4000 * 4
    cfg.layers[-1].centroid_weight = 0.0
    assert slide.memory.estimate(cfg, 5000, 4000)["centroids"] == 0
    cfg.layers[-1].centroid_weight, cfg.layers[-1].centroid_kind = 2.0, "ridge"   # ridge vectors are dense already
    assert slide.memory.estimate(cfg, 5000, 4000)["centroids"] == 0
    cfg.layers[-1].centroid_kind = "mean"                                         # too large for the copy
    assert slide.memory.estimate(cfg, 47_236, 4000)["centroids"] == 0


def test_top_k_of_pooled_rows_orders_by_score_then_label_id():
    """On a wide layer each row ranks its own pool of labels (sorted ids, rows of any length):
    higher score first, ties to the lower id, NaN last, a row with fewer labels than k keeps
    them all."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        m = int(rng.integers(1, 12))
        lens = rng.integers(0, 9, m)
        cip = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        cand = np.concatenate([np.sort(rng.choice(10_000, n, replace=False)) for n in lens]).astype(np.int32)
        mixed = rng.integers(0, 4, cip[-1]).astype(np.float64)     # ties everywhere
        if trial % 4 == 0 and cip[-1]:
            mixed[rng.integers(0, cip[-1], 2)] = -np.inf
        if trial % 5 == 0 and cip[-1]:
            mixed[rng.integers(0, cip[-1], 2)] = np.nan
        k = int(rng.choice([1, 3, 5]))
        rows, rank, pos, labels = centroids._best(m, 10_000, cip, cand, mixed, k)
        want = []
        for i in range(m):
            entries = sorted(range(cip[i], cip[i + 1]),
                             key=lambda p: (np.isnan(mixed[p]), -mixed[p] if not np.isnan(mixed[p]) else 0, cand[p]))
            want += [(i, r, p) for r, p in enumerate(entries[:k])]
        got = list(zip(rows.tolist(), rank.tolist(), pos.tolist()))
        assert got == want, (trial, k)
        np.testing.assert_array_equal(labels, cand[pos])


def test_a_searchs_choice_on_a_wide_layer_reuses_the_validation_pass(monkeypatch):
    """On a wide layer the search's validation pass keeps each row's best POOL labels and the
    label term's choice at a new best starts from them instead of scoring the rows again: the
    same metrics, the same choice, the same trained network as scoring them twice."""
    X, Y = _problem(n=500, L=60, seed=12)
    monkeypatch.setattr(centroids, "FULL_LABELS", 10)
    monkeypatch.setattr(centroids, "POOL", 8)
    calls = []
    orig_choose = centroids.choose

    def fit(reuse: bool):
        def choose(net, valid, cands, top=None):
            calls.append(top is not None)
            return orig_choose(net, valid, cands, top=top if reuse else None)

        monkeypatch.setattr(centroids, "choose", choose)
        net = slide.Network({"layers": [{"size": 16}, {"size": None, "sampling": "dense"}],
                             "training": {"ensemble": 1, "max_epochs": 12}, "optimizer": {"lr_search": []}},
                            threads=1, seed=3)
        hist = net.fit((X, Y), epochs="auto")
        return net, hist

    a, ha = fit(True)
    assert calls and all(calls)                   # the pass's labels reached every choice
    b, hb = fit(False)
    assert ha.centroid_search == hb.centroid_search and a.centroid_weight == b.centroid_weight
    assert [r["valid/P@1"] for r in ha.records if "valid/P@1" in r] == \
        [r["valid/P@1"] for r in hb.records if "valid/P@1" in r]
    np.testing.assert_array_equal(a.predict(X[:50], k=5)[0], b.predict(X[:50], k=5)[0])
    # the pass's metrics from its POOL labels are those of a top-k pass
    valid = a._convert(X[400:].tocsr(), Y[400:].tocsr())
    a.centroid_weight = 0
    kept = []
    assert a._evaluate_arrays(valid, (1, 3, 5), pool=kept) == a._evaluate_arrays(valid, (1, 3, 5))
    assert kept[0].shape == (100, 8)
    for given, own in zip(centroids.pools(a, valid, a._centroids, "exact", 1, top=kept[0]),
                          centroids.pools(a, valid, a._centroids, "exact", 1)):
        for u, v in zip(given, own):
            np.testing.assert_array_equal(u, v)
