"""slide.scaling: the one row scaling that slide, the baselines and the synthetic generator share."""
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.scaling import idf_weights, normalize_rows


def _rows(seed=0, n=40, d=30):
    """float32 CSR with empty rows at the start, the middle and the end."""
    rng = np.random.default_rng(seed)
    dense = (rng.uniform(0.1, 3.0, (n, d)) * (rng.random((n, d)) < 0.3)).astype(np.float32)
    dense[[0, n // 2, n - 1]] = 0
    return sp.csr_matrix(dense)


def _reference(x, idf=None):
    """Row by row: float32 values (times idf), norm summed in float64 in storage order."""
    out = []
    for i in range(x.shape[0]):
        vals = x.data[x.indptr[i]:x.indptr[i + 1]].astype(np.float32)
        if idf is not None:
            vals = vals * idf[x.indices[x.indptr[i]:x.indptr[i + 1]]]
        acc = 0.0
        for v in vals:
            acc += float(v) ** 2
        norm = np.float32(np.sqrt(acc)) if acc > 0 else np.float32(1.0)
        out.append(vals / norm)
    return np.concatenate(out)


@pytest.mark.parametrize("mode", ["l2", "tfidf_l2"])
def test_rows_match_a_row_by_row_reference_bit_for_bit(mode):
    x = _rows()
    idf = idf_weights(x)
    z = normalize_rows(x, mode, idf)
    expected = _reference(x, idf if mode == "tfidf_l2" else None)
    assert z.dtype == np.float32 and np.array_equal(z.indptr, x.indptr) and np.array_equal(z.indices, x.indices)
    assert np.array_equal(z.data.view(np.uint32), expected.astype(np.float32).view(np.uint32))
    norms = np.sqrt(np.asarray(z.multiply(z).sum(axis=1), dtype=np.float64).ravel())
    assert norms[0] == norms[20] == norms[-1] == 0.0     # empty rows stay empty, not NaN
    np.testing.assert_allclose(np.delete(norms, [0, 20, 39]), 1.0, rtol=1e-6)


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 20])
@pytest.mark.parametrize("mode", ["l2", "tfidf_l2"])
def test_rows_scaled_block_by_block_give_the_same_bits(monkeypatch, mode, block):
    """Blocks of rows (a row longer than a block is a block of its own) change nothing."""
    import slide.scaling as scaling

    monkeypatch.setattr(scaling, "SCALE_BLOCK", block)
    x = _rows(seed=3)
    idf = idf_weights(x)
    z = normalize_rows(x, mode, idf)
    expected = _reference(x, idf if mode == "tfidf_l2" else None)
    assert np.array_equal(z.data.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def test_scaling_a_large_matrix_allocates_no_whole_matrix_temporaries(monkeypatch):
    """A training set is scaled in blocks: numpy's temporaries stay far below its values (a
    whole-matrix float64 square, concatenation and repeat were five times them, the peak of a
    full-size training run)."""
    import tracemalloc

    import slide.scaling as scaling

    monkeypatch.setattr(scaling, "SCALE_BLOCK", 1 << 16)   # a sixteenth of the default

    n, per_row = 40_000, 100
    indptr = np.arange(n + 1, dtype=np.int32) * per_row
    rng = np.random.default_rng(0)
    x = sp.csr_matrix((rng.random(n * per_row, dtype=np.float32) + 0.5,
                       np.tile(np.arange(per_row, dtype=np.int32) * 10, n), indptr), shape=(n, 1000))
    values = x.data.nbytes   # 16 MB
    tracemalloc.start()
    try:
        z = normalize_rows(x, "l2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < values + values // 4, (peak, values)    # the copy of the values and a block
    np.testing.assert_allclose(np.sqrt(z.multiply(z).sum(axis=1)).A1, 1.0, rtol=1e-5)


def test_input_is_not_modified_and_none_only_converts():
    x = _rows().astype(np.float64)
    before = x.copy()
    normalize_rows(x, "l2")
    assert (x != before).nnz == 0
    z = normalize_rows(x, "none")
    assert z.dtype == np.float32 and np.array_equal(z.toarray(), before.toarray().astype(np.float32))


def test_float32_input_shares_its_index_arrays_and_keeps_its_values():
    """The normalised copy of a float32 CSR matrix (a training set) copies only the values."""
    x = _rows()
    assert x.dtype == np.float32
    before = x.data.copy()
    z = normalize_rows(x, "l2")
    assert np.shares_memory(z.indices, x.indices) and np.shares_memory(z.indptr, x.indptr)
    assert not np.shares_memory(z.data, x.data)
    assert np.array_equal(x.data, before) and not np.array_equal(z.data, x.data)
    np.testing.assert_array_equal(z.toarray(), normalize_rows(x.astype(np.float64), "l2").toarray())


def test_idf_weights_hand_computed():
    x = sp.csr_matrix(np.array([[1, 0, 2], [0, 0, 1], [3, 0, 0], [1, 0, 1]], dtype=np.float32))
    # n = 4 rows; document frequencies 3, 0, 3
    expected = np.log(5.0 / np.array([4.0, 1.0, 4.0])) + 1.0
    np.testing.assert_array_equal(idf_weights(x, dtype=np.float64), expected)
    assert idf_weights(x).dtype == np.float32


def test_bad_arguments_raise():
    x = _rows()
    with pytest.raises(ValueError, match="data.normalize must be one of none, l2, tfidf_l2"):
        normalize_rows(x, "l1")
    with pytest.raises(ValueError, match="needs the idf weights"):
        normalize_rows(x, "tfidf_l2")
    with pytest.raises(ValueError, match="idf has 3 weights for 30 features"):
        normalize_rows(x, "tfidf_l2", np.ones(3))


@pytest.mark.parametrize("mode", ["l2", "tfidf_l2"])
def test_the_network_scales_rows_with_the_shared_function(mode):
    x = _rows()
    y = sp.csr_matrix((np.ones(x.shape[0], np.float32), np.arange(x.shape[0]) % 5,
                       np.arange(x.shape[0] + 1)), shape=(x.shape[0], 5))
    net = slide.Network(normalize=mode, hidden=8, epochs=1, threads=1, valid_fraction=0.0)
    net.fit((x, y))
    if mode == "tfidf_l2":   # learnt from the training rows, as the baselines learn theirs
        np.testing.assert_array_equal(net._idf, idf_weights(x))
    z = net._normalize(x)
    assert np.array_equal(z.data.view(np.uint32), normalize_rows(x, mode, idf_weights(x)).data.view(np.uint32))


def test_baselines_and_the_generator_use_the_same_function():
    import slide.baselines as baselines
    import slide.datasets.synthetic as synthetic
    import slide.network as network

    assert baselines.normalize_rows is normalize_rows and baselines.idf_weights is idf_weights
    assert network.normalize_rows is normalize_rows and synthetic.normalize_rows is normalize_rows


def _labelled(seed=0):
    x = _rows(seed, n=60)
    y = sp.csr_matrix((np.ones(x.shape[0], np.float32), np.arange(x.shape[0]) % 5,
                       np.arange(x.shape[0] + 1)), shape=(x.shape[0], 5))
    return x, y


def _trained(x, y, mode, copy, **fit):
    net = slide.Network(normalize=mode, hidden=8, epochs=2, threads=1, valid_fraction=0.0, seed=4)
    net.fit((x, y), copy=copy, **fit)
    return net


@pytest.mark.parametrize("mode", ["l2", "tfidf_l2"])
def test_fit_without_copy_scales_train_in_place_and_learns_the_same_bits(mode):
    x, y = _labelled()
    original = x.data.copy()
    ref = _trained(x, y, mode, copy=True)
    assert np.array_equal(x.data, original)   # the default leaves the caller's values alone
    net = _trained(x, y, mode, copy=False)
    # the values were scaled where they lie (no second copy), exactly as the copying path scales
    scaled = normalize_rows(sp.csr_matrix((original, x.indices, x.indptr), shape=x.shape), mode, idf_weights(x))
    assert np.array_equal(x.data.view(np.uint32), scaled.data.view(np.uint32))
    for k, v in ref.parameters().items():
        assert np.array_equal(v, net.parameters()[k]), k
    q = _rows(7, n=10)
    assert np.array_equal(ref.predict(q, k=3)[0], net.predict(q, k=3)[0])


def test_fit_without_copy_keeps_values_that_are_read_again():
    x, y = _labelled()
    original = x.data.copy()
    # validation rows that are the training rows: scaling in place would scale them twice
    ref = _trained(x, y, "l2", copy=True, valid=(x, y))
    net = _trained(x, y, "l2", copy=False, valid=(x, y))
    assert np.array_equal(x.data, original)
    assert net.history.records[-1]["valid/nDCG@5"] == ref.history.records[-1]["valid/nDCG@5"]
    for k, v in ref.parameters().items():
        assert np.array_equal(v, net.parameters()[k]), k
    # a validation split held out of train (epochs=auto) is trained on again by the refit
    net = slide.Network(normalize="l2", hidden=8, epochs="auto", max_epochs=2, threads=1, seed=4)
    net.fit((x, y), copy=False)
    assert np.array_equal(x.data, original)
    # nothing to scale: the values are used as they are
    x2 = x.copy()
    _trained(x2, y, "none", copy=False)
    assert np.array_equal(x2.data, original)


def test_a_cli_run_trains_on_its_own_data_without_a_copy(tmp_path, monkeypatch):
    """`slide train` owns the data it loaded: the training values are scaled in place."""
    from slide.runs import RunDir, train_run

    x, y = _labelled()
    test = _labelled(1)
    original = x.data.copy()
    cfg = slide.Config.from_dict({"data": {"normalize": "l2"}, "layers": [{"size": 8, "activation": "relu"}, {"activation": "softmax"}],
                                  "training": {"epochs": 2, "threads": 1}})
    data = (slide.Dataset(x, y), None, slide.Dataset(*test))
    train_run(cfg, RunDir.create(tmp_path / "a", cfg), data=data)
    assert np.array_equal(x.data, original)     # data the caller lent: not touched
    summary = train_run(cfg, RunDir.create(tmp_path / "b", cfg), data=data, data_owned=True)
    assert not np.array_equal(x.data, original)
    assert summary["evaluated_on"] == "test"


# ------------------------------------------------------------------ data.standardize

def _dense_problem(seed=0, n=300, d=12, L=4):
    """Dense real-valued features on very different scales (one column 1000x the others, one
    constant) whose labels depend on the small-scale columns."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, 0] = rng.normal(5000.0, 1000.0, n)     # a large-scale column that carries no label signal
    X[:, 1] = 3.0                                # constant
    y = np.argmax(X[:, 2:2 + L], axis=1)
    Y = sp.csr_matrix((np.ones(n, np.float32), y, np.arange(n + 1)), shape=(n, L))
    return sp.csr_matrix(X), Y


def test_standardization_statistics_and_the_centred_matrix_are_hand_checked():
    from slide.scaling import feature_standardization, standardize

    x = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [3.0, 0.0, 2.0]], dtype=np.float32))
    mean, scale = feature_standardization(x, num_features=4)
    np.testing.assert_allclose(mean, [2.0, 0.0, 2.0, 0.0])
    np.testing.assert_allclose(scale, [1.0, 1.0, 1.0, 1.0])   # constant columns keep scale 1
    z = standardize(x, mean, scale)
    assert z.shape == (2, 4) and z.nnz == 8 and z.dtype == np.float32   # every entry stored
    np.testing.assert_allclose(z.toarray(), [[-1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    with pytest.raises(ValueError, match="data has 5 features, the statistics have 4"):
        standardize(sp.csr_matrix((1, 5), dtype=np.float32), mean, scale)


def test_auto_standardizes_dense_features_only():
    from slide.scaling import wants_standardize

    dense = sp.csr_matrix(np.ones((10, 4), np.float32))
    sparse = sp.csr_matrix(np.eye(10, 4, dtype=np.float32))   # 10% of the entries stored
    assert wants_standardize("auto", dense) and not wants_standardize("auto", sparse)
    assert wants_standardize(True, sparse) and not wants_standardize(False, dense)
    with pytest.raises(ValueError, match=r"data.standardize: centring 300,000 rows x 1,000 features .* "
                                         r"set data.standardize: false"):
        wants_standardize(True, sp.csr_matrix((300_000, 1_000), dtype=np.float32))


def test_the_network_learns_from_standardized_dense_features_and_keeps_the_statistics(tmp_path):
    X, Y = _dense_problem()
    Xt, Yt = _dense_problem(seed=1)
    p1 = {}
    for setting in ("auto", False):
        net = slide.Network(standardize=setting, hidden=16, epochs=60, threads=1, seed=0, valid_fraction=0.0,
                            dropout=0.0)
        net.fit((X, Y))
        p1[setting] = net.evaluate((Xt, Yt), k=1)["P@1"]
        if setting == "auto":
            auto = net
    # after the row scaling the large column drowns the others unless the features are standardized
    assert auto.standardized and p1["auto"] >= 0.7 and p1["auto"] >= p1[False] + 0.3, p1
    mean, scale = auto._standard
    np.testing.assert_allclose(mean[0], X[:, 0].toarray().mean(), rtol=1e-5)
    assert scale[1] == 1.0
    path = tmp_path / "m.slide"
    auto.save(path)
    loaded = slide.Network.load(path)
    np.testing.assert_array_equal(loaded._standard[0], mean)
    top, _ = auto.predict(Xt, k=2)
    assert np.array_equal(loaded.predict(Xt, k=2)[0], top)
    # one row at a time takes the single-query path: the same standardization
    assert np.array_equal(np.vstack([loaded.predict(Xt[i], k=2)[0] for i in range(10)]), top[:10])


def test_sparse_text_features_are_not_standardized_by_default(bibtex):
    train, _ = bibtex
    net = slide.Network(hidden=8, epochs=1, threads=1, valid_fraction=0.0)
    net.fit(train[:200])
    assert not net.standardized


def test_baselines_see_the_same_standardized_rows():
    from slide.baselines import scale_rows, standardization_for

    X, _ = _dense_problem()
    net = slide.Network(hidden=8, epochs=1, threads=1, valid_fraction=0.0)
    net.fit(_dense_problem())
    standard = standardization_for(net.config, X)
    ours = net._normalize(X)
    theirs = scale_rows(X, X.shape[1], "l2", None, standard)
    assert np.array_equal(ours.data.view(np.uint32), theirs.data.view(np.uint32))


def test_a_model_file_with_broken_statistics_is_refused(tmp_path):
    import zipfile

    X, Y = _dense_problem()
    net = slide.Network(hidden=8, epochs=1, threads=1, valid_fraction=0.0)
    net.fit((X, Y))
    path = tmp_path / "m.slide"
    net.save(path)
    bad = tmp_path / "bad.slide"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            if item.filename != "feature_scale.npy":
                zout.writestr(item, zin.read(item.filename))
    with pytest.raises(ValueError, match="one of feature_mean and feature_scale is missing"):
        slide.Network.load(bad)


def test_slide_train_says_when_it_standardized(tmp_path):
    """The CLI line after training and summary.json name the standardization."""
    import json

    from conftest import run_cli

    X, Y = _dense_problem()
    ds = slide.Dataset(X, Y)
    ds.save(tmp_path / "train.txt")
    (tmp_path / "c.yaml").write_text("data: {train: train.txt, valid_fraction: 0.2}\n"
                                     "layers: [{size: 8}, {size: null, activation: auto}]\ntraining: {epochs: 2, threads: 1}\n")
    r = run_cli("train", tmp_path / "c.yaml", "--quiet", "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "features standardized (dense input)" in r.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["standardized"] is True


def test_the_statistics_are_computed_once_and_shared_with_the_learning_rate_search(monkeypatch):
    """epochs=auto with lr_search: the search networks at other rates standardize with the
    statistics of all of train, as the network that refits does (not with those of the rows
    they search on)."""
    import slide.network as network

    calls = []
    real = network.feature_standardization
    monkeypatch.setattr(network, "feature_standardization", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    X, Y = _dense_problem(n=200)
    net = slide.Network(hidden=8, threads=1, seed=0, max_epochs=3, ensemble=1)
    net.fit((X, Y))
    assert len(net.history.lr_search) == 3      # the search ran at three rates
    assert calls == [(200, 12)]                 # once, on all 200 training rows
    np.testing.assert_allclose(net._standard[0], real(X)[0])
