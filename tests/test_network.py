"""slide.Network: training loop, evaluation, prediction checks, persistence and resume."""
import os
import time
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import callbacks
from slide.config import Config, ConfigError
from slide.network import FORMAT_VERSION, Network, choose_sampling

from conftest import assert_same_parameters


def make_problem(n=600, num_features=300, num_labels=24, seed=0):
    """Learnable multi-label data: each label owns a few features that its points show."""
    rng = np.random.default_rng(seed)
    owned = [rng.choice(num_features, 8, replace=False) for _ in range(num_labels)]
    xr, xc, yr, yc = [], [], [], []
    for i in range(n):
        labels = rng.choice(num_labels, rng.integers(1, 3), replace=False)
        feats = set(rng.choice(num_features, 4, replace=False))   # noise
        for lab in labels:
            feats.update(rng.choice(owned[lab], 5, replace=False))
            yr.append(i)
            yc.append(lab)
        for f in feats:
            xr.append(i)
            xc.append(f)
    X = sp.csr_matrix((np.ones(len(xr), np.float32), (xr, xc)), shape=(n, num_features))
    Y = sp.csr_matrix((np.ones(len(yr), np.float32), (yr, yc)), shape=(n, num_labels))
    return X, Y


@pytest.fixture(scope="module")
def data():
    X, Y = make_problem()
    return (X[:450], Y[:450]), (X[450:], Y[450:])


def small(**kw):
    base = dict(hidden=32, epochs=2, batch_size=32, lr=0.01, threads=1, seed=3)
    base.update(kw)
    return Network(**base)


def test_fit_learns_and_records_history(data):
    train, test = data
    net = small(epochs=4)
    hist = net.fit(train, test=test)
    assert isinstance(hist, slide.History)
    assert [r["epoch"] for r in hist.records] == [1, 2, 3, 4]
    assert net.epoch == 4 and net.step == 4 * 15
    rec = hist.records[-1]
    for key in ("step", "epoch", "seconds", "samples_per_second", "loss", "lr",
                "test/P@1", "test/P@3", "test/nDCG@5", "test/PSP@1", "P@1"):
        assert key in rec, key
    assert rec["P@1"] == rec["test/P@1"]            # unprefixed = test set when given
    assert rec["samples_per_second"] > 0
    assert hist.records[0]["seconds"] < rec["seconds"]
    assert hist.records[-1]["loss"] < hist.records[0]["loss"]
    # 24 labels with 1-2 per point: chance P@1 is about 0.06
    assert net.evaluate(test)["P@1"] > 0.5
    assert net.resolved_sampling == ["dense", "dense"]
    assert net.config.layers[-1].size == 24


def test_evaluate_matches_metrics_module(data):
    train, test = data
    net = small()
    net.fit(train)
    m = net.evaluate(test, k=(1, 3))
    top, _ = net.predict(test[0], k=3)
    ref = slide.metrics.evaluate(top, test[1], k=(1, 3), propensities=slide.metrics.propensities(
        train[1], net.config.eval.propensity_a, net.config.eval.propensity_b))
    assert m == pytest.approx(ref)
    assert set(m) >= {"P@1", "P@3", "nDCG@3", "PSP@1", "PSP@3"}


def test_unprefixed_metrics_are_valid_without_test(data):
    train, test = data
    hist = small(epochs=1).fit(train, valid=test)
    rec = hist.records[0]
    assert rec["P@1"] == rec["valid/P@1"]
    assert not any(k.startswith("test/") for k in rec)


def test_overrides_map_to_config():
    net = Network(epochs=7, batch_size=64, lr=0.02, threads=1, seed=9, hidden=[64, 32],
                  dropout=0.25, weight_decay=1e-4, normalize="tfidf_l2", sampling="dense", k=[1, 2])
    c = net.config
    assert (c.training.epochs, c.training.batch_size, c.optimizer.lr, c.training.threads) == (7, 64, 0.02, 1)
    assert c.training.seed == 9 and c.training.dropout == 0.25 and c.optimizer.weight_decay == 1e-4
    assert [layer.size for layer in c.layers] == [64, 32, None]
    assert c.layers[-1].activation == "auto" and c.layers[-1].sampling == "dense"
    assert c.data.normalize == "tfidf_l2" and c.eval.k == [1, 2]
    assert not net.built


def test_config_sources_and_override_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("training:\n  epochs: 3\noptimizer:\n  lr: 0.005\n")
    net = Network(str(p), epochs=5)
    assert net.config.training.epochs == 5 and net.config.optimizer.lr == 0.005
    assert Network({"training": {"epochs": 2}}).config.training.epochs == 2
    assert Network(Config()).config.training.epochs == Config().training.epochs
    with pytest.raises(TypeError, match="did you mean 'epochs'"):
        Network(epoch=3)
    with pytest.raises(ConfigError, match=r"training\.batch_size"):
        Network(batch_size=0)
    with pytest.raises(ConfigError, match="hidden"):
        Network(hidden=[64, 0])


def test_sampling_auto_uses_a_cost_model():
    assert choose_sampling(Config(), 159) == ["dense", "dense"]
    assert choose_sampling(Config(), 670_000) == ["dense", "lsh"]
    # from 10,000 labels the default lsh settings (at most 4,000 active) pay for the hashing
    assert choose_sampling(Config(), 9_999) == ["dense", "dense"]
    assert choose_sampling(Config(), 10_000) == ["dense", "lsh"]
    assert choose_sampling(Config(), 20_000) == ["dense", "lsh"]
    # ... but not where more than 40% of the layer would be active
    wide = Config.from_dict({"layers": [{"size": 1024}, {"lsh": {"max_active": 5000}}]})
    assert choose_sampling(wide, 10_000) == ["dense", "dense"]
    assert choose_sampling(wide, 12_500) == ["dense", "lsh"]
    c = Config.from_dict({"layers": [{"size": 128}, {"activation": "softmax", "sampling": "auto",
                                                     "lsh": {"max_active": 0, "L": 400}}]})
    # 400 tables x 128 per bucket would activate most of a 100K layer: dense is cheaper
    assert choose_sampling(c, 100_000) == ["dense", "dense"]
    with pytest.raises(ConfigError, match=r"layers\.0\.sampling"):
        choose_sampling(Config.from_dict({"layers": [{"size": 128, "sampling": "lsh"},
                                                     {"activation": "softmax"}]}), 1000)


def test_output_activation_auto_resolves_by_sampling():
    # auto: per-label sigmoid on a dense output layer, softmax where LSH samples the layer
    assert Network(num_features=20, num_labels=159, hidden=8).config.layers[-1].activation == "sigmoid"
    wide = Network(num_features=20, num_labels=30_000, hidden=8, threads=1)
    assert wide.resolved_sampling[-1] == "lsh" and wide.config.layers[-1].activation == "softmax"
    # explicit choices stay as written
    soft = {"layers": [{"size": 8}, {"activation": "softmax"}]}
    assert Network(soft, num_features=20, num_labels=159).config.layers[-1].activation == "softmax"
    # an output layer that names no activation gets auto (hidden layers keep relu), in YAML too
    bare = Network({"layers": [{"size": 8}, {"size": None}]}, num_features=20, num_labels=159)
    assert [l.activation for l in bare.config.layers] == ["relu", "sigmoid"]
    linear = Network({"layers": [{"size": None}]}, num_features=20, num_labels=159)
    assert linear.config.layers[-1].activation == "sigmoid"


@pytest.mark.parametrize("layers,message", [
    ([{"size": 8, "activation": "sigmoid"}, {"activation": "softmax"}],
     r"layers\.0\.activation: sigmoid is only allowed on the last"),
    ([{"size": 8}, {"activation": "relu"}], r"layers\.1\.activation: the output layer must use softmax, sigmoid or auto"),
    ([{"size": 8}, {"activation": "sigmoid", "sampling": "lsh", "lsh": {"negative_weight": -1}}],
     r"layers\.1\.lsh\.negative_weight: must be >= 0"),
    ([{"size": 8}, {"activation": "tanh"}], r"layers\.1\.activation: must be one of"),
])
def test_output_activation_errors_name_the_key(layers, message):
    with pytest.raises(ConfigError, match=message):
        Network({"layers": layers})


def test_sigmoid_stays_sigmoid_when_auto_chooses_lsh():
    # a per-label binary loss on the hash-sampled neurons (only `activation: auto` means softmax there)
    cfg = {"layers": [{"size": 8}, {"activation": "sigmoid", "sampling": "auto"}]}
    net = Network(cfg, num_features=20, num_labels=30_000, threads=1)
    assert net.resolved_sampling[-1] == "lsh" and net.config.layers[-1].activation == "sigmoid"


def test_sigmoid_output_learns_and_scores_are_per_label_probabilities(data):
    train, test = data
    net = small(epochs=12)   # per-label losses start slower than softmax (0.60 after 4 epochs)
    assert net.config.layers[-1].activation == "auto"
    net.fit(train)
    assert net.config.layers[-1].activation == "sigmoid"
    assert net.evaluate(test)["P@1"] > 0.9
    _, scores = net.predict(test[0], k=24)
    # independent sigmoids: in (0, 1), sorted, and not a distribution over the labels
    assert np.all((scores > 0) & (scores < 1)) and np.all(np.diff(scores, axis=1) <= 0)
    assert not np.allclose(scores.sum(1), 1.0, atol=1e-2)


def test_eager_build_and_predict_checks(data):
    train, test = data
    net = small(num_features=300, num_labels=24)
    assert net.built and net.step == 0
    X = test[0]
    labels, scores = net.predict(X, k=3)
    assert labels.shape == (150, 3) and labels.dtype == np.int32 and scores.dtype == np.float32
    assert np.all(np.diff(scores, axis=1) <= 0)
    dense_labels, dense_scores = net.predict(X.toarray(), k=3)
    np.testing.assert_array_equal(dense_labels, labels)
    np.testing.assert_allclose(dense_scores, scores, rtol=1e-6)
    with pytest.raises(ValueError, match="feature id 300.*300 features"):
        net.predict(sp.csr_matrix(([1.0], ([0], [300])), shape=(1, 301)))
    with pytest.raises(ValueError, match="k must be"):
        net.predict(X, k=0)
    with pytest.raises(ValueError, match="k must be"):
        net.predict(X, k=25)
    with pytest.raises(ValueError, match="mode"):
        net.predict(X, mode="fast")
    with pytest.raises(ValueError, match="2-D"):
        net.predict(np.ones(300))
    with pytest.raises(ValueError, match="dtype"):
        net.predict(np.array([["a", "b"]]))
    bad = X.copy()
    bad.data[5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        net.predict(bad)
    with pytest.raises(RuntimeError, match="not been trained"):
        small().predict(X)


def test_fit_rejects_mismatched_data(data):
    train, _ = data
    with pytest.raises(ValueError, match="feature rows"):
        small().fit((train[0], train[1][:10]))
    with pytest.raises(TypeError, match="Dataset"):
        small().fit(train[0])
    net = small(epochs=1)
    net.fit(train)
    wide = sp.hstack([train[0], sp.csr_matrix((450, 5))]).tocsr()
    with pytest.raises(ValueError, match="305 features"):
        net.fit((wide, train[1]), epochs=2)

def test_patience_without_validation_data_is_unused(data):
    train, _ = data
    hist = small(patience=1, epochs=3).fit(train)
    assert len(hist) == 3 and hist.best_epoch is None and not hist.stopped_early


def test_dataset_objects_are_accepted(data):
    train, test = data
    tr = slide.Dataset(train[0], train[1])
    te = slide.Dataset(test[0], test[1])
    net = small(epochs=1)
    net.fit(tr, test=te)
    assert net.evaluate(te) == net.evaluate(test)
    np.testing.assert_array_equal(net.predict(te)[0], net.predict(test[0])[0])


def params_of(net):
    return {k: np.array(v) for k, v in net.parameters().items()}


@pytest.mark.parametrize("normalize", ["l2", "tfidf_l2"])
def test_resume_is_bit_identical(data, tmp_path, normalize):
    train, test = data
    full = small(epochs=2, normalize=normalize, dropout=0.2)
    full.fit(train)
    half = small(epochs=2, normalize=normalize, dropout=0.2)
    half.fit(train, epochs=1)
    half.save(tmp_path / "half.npz")
    resumed = Network.load(tmp_path / "half.npz")
    assert resumed.epoch == 1 and resumed.step == 15
    resumed.fit(train)                       # continues to training.epochs = 2
    assert resumed.epoch == 2 and resumed.step == full.step
    assert_same_parameters(full, resumed)
    np.testing.assert_array_equal(full.predict(test[0])[1], resumed.predict(test[0])[1])


def test_resume_mid_epoch_is_bit_identical(data, tmp_path):
    train, _ = data
    full = small(epochs=2)
    full.fit(train)
    part = small(epochs=2)
    part.fit(train, callbacks=[callbacks.StopAfter(20)])   # stops 5 batches into epoch 2
    assert part.step == 20 and part.epoch == 1
    path = tmp_path / "mid.npz"
    part.save(path)
    resumed = Network.load(path)
    resumed.fit(train)
    assert resumed.step == full.step
    assert_same_parameters(full, resumed)


def lsh_output(K=2, **kw):
    """A small network whose output layer samples by LSH and rebuilds its tables often."""
    cfg = {"layers": [{"size": 32},
                      {"activation": "softmax", "sampling": "lsh",
                       "lsh": {"K": K, "L": 4, "min_active": 4, "max_active": 10}}],
           "training": {"epochs": 2, "batch_size": 32, "threads": 1, "seed": 3, "rebuild_first": 4}}
    return Network(cfg, lr=0.01, **kw)


@pytest.mark.parametrize("K", [2, 4])  # 6-bit ids (direct lookup) and 12-bit ids (hashed lookup)
def test_resume_with_lsh_output_is_bit_identical(data, tmp_path, K):
    """The hash tables and rebuild schedule travel with the checkpoint (15 batches per epoch:
    the save falls between two rebuilds, so tables rebuilt from the weights would differ)."""
    train, test = data
    full = lsh_output(K)
    full.fit(train)
    half = lsh_output(K)
    half.fit(train, epochs=1)
    assert half.resolved_sampling == ["dense", "lsh"] and half.step == 15
    half.save(tmp_path / "half.npz")
    resumed = Network.load(tmp_path / "half.npz")
    for name in ("num_rows", "table_offsets", "bucket_ids", "bucket_offsets", "items"):
        np.testing.assert_array_equal(np.asarray(resumed._core.table_state(1)[name]),
                                      np.asarray(half._core.table_state(1)[name]), err_msg=name)
    assert resumed._core.next_rebuild == half._core.next_rebuild > 15
    resumed.fit(train)
    assert resumed.epoch == 2 and resumed.step == full.step == 30
    assert_same_parameters(full, resumed)
    for mode in ("exact", "lsh"):
        a, b = full.predict(test[0], mode=mode), resumed.predict(test[0], mode=mode)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def _npz_arrays(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _damage(arrays, kind):
    """Damages the stored hash tables of layer 1 in place."""
    t = "tables/1/"
    if kind == "item_out_of_range":
        arrays[t + "items"] = arrays[t + "items"].copy()
        arrays[t + "items"][0] = 10_000
    elif kind == "offsets_not_monotone":
        arrays[t + "bucket_offsets"] = arrays[t + "bucket_offsets"].copy()
        arrays[t + "bucket_offsets"][1] = -5
    elif kind == "table_offsets_short":
        arrays[t + "table_offsets"] = arrays[t + "table_offsets"][:-1]
    elif kind == "bucket_id_too_large":
        arrays[t + "bucket_ids"] = arrays[t + "bucket_ids"].copy()
        arrays[t + "bucket_ids"][0] = 2**30
    elif kind == "wrong_dtype":
        arrays[t + "bucket_ids"] = arrays[t + "bucket_ids"].astype(np.int64)
    elif kind == "one_array_missing":
        del arrays[t + "items"]
    elif kind == "tables_of_a_dense_layer":
        for k in [k for k in arrays if k.startswith(t)]:
            arrays[k.replace(t, "tables/0/")] = arrays[k]


@pytest.mark.parametrize("kind, message", [
    ("item_out_of_range", r"layer 1: hash tables: items\[0\]=10000 is out of range"),
    ("offsets_not_monotone", r"layer 1: hash tables: bucket_offsets\[1\]=-5"),
    ("table_offsets_short", r"layer 1: hash tables: table_offsets has 4 entries, expected L \+ 1 = 5"),
    ("bucket_id_too_large", r"layer 1: hash tables: bucket_ids\[0\]=1073741824 is not below 2\^"),
    ("wrong_dtype", r"layer 1: bucket_ids: expected a numpy array of uint32, got int64"),
    ("one_array_missing", r"layer 1: items: missing"),
    ("tables_of_a_dense_layer", r"hash tables stored for layer 0, which does not sample by LSH"),
])
def test_load_rejects_damaged_hash_tables(data, tmp_path, kind, message):
    train, _ = data
    net = lsh_output(epochs=1)
    net.fit(train)
    net.save(tmp_path / "good.npz")
    arrays = _npz_arrays(tmp_path / "good.npz")
    _damage(arrays, kind)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=f"bad.npz: .*{message}"):
        Network.load(tmp_path / "bad.npz")


def test_random_damage_to_hash_tables_never_crashes(data, tmp_path):
    """Arbitrary values in the stored table arrays (in a file that is otherwise intact) are
    refused with a ValueError naming the file, or form valid tables that predict."""
    train, test = data
    net = lsh_output(K=4, epochs=1)
    net.fit(train)
    net.save(tmp_path / "good.npz")
    arrays = _npz_arrays(tmp_path / "good.npz")
    names = ["tables/1/table_offsets", "tables/1/bucket_ids", "tables/1/bucket_offsets", "tables/1/items"]
    rng = np.random.default_rng(0)
    refused = 0
    for trial in range(80):
        damaged = dict(arrays)
        name = names[trial % len(names)]
        v = damaged[name].copy()
        info = np.iinfo(v.dtype)
        values = [info.min, info.max, -1, 0, 1, len(v), int(rng.integers(0, 64)), 2**31 - 1]
        for _ in range(int(rng.integers(1, 3))):
            v[rng.integers(0, len(v))] = np.array(values[rng.integers(0, len(values))]).astype(v.dtype)
        damaged[name] = v
        path = tmp_path / "damaged.npz"
        np.savez(path, **damaged)
        try:
            back = Network.load(path)
        except ValueError as e:
            assert "damaged.npz" in str(e) and "hash tables" in str(e), str(e)
            refused += 1
            continue
        labels, scores = back.predict(test[0], k=3, mode="lsh")
        assert labels.max() < 24 and np.isfinite(scores).all()
    assert refused >= 40


def test_files_without_hash_tables_still_load(data, tmp_path):
    """Files from before tables were stored load with tables rebuilt from their weights."""
    train, test = data
    net = lsh_output(epochs=1)
    net.fit(train)
    net.save(tmp_path / "new.npz")
    old = tmp_path / "old.npz"
    np.savez(old, **{k: v for k, v in _npz_arrays(tmp_path / "new.npz").items() if not k.startswith("tables/")})
    with zipfile.ZipFile(old) as z:
        assert not any(n.startswith("tables/") for n in z.namelist())
    back = Network.load(old)
    assert_same_parameters(net, back)
    assert back.step == 15 and back._core.next_rebuild == net._core.next_rebuild
    np.testing.assert_array_equal(back.predict(test[0])[0], net.predict(test[0])[0])


def test_save_is_atomic_and_load_restores_everything(data, tmp_path):
    train, test = data
    net = small(epochs=2, normalize="tfidf_l2")
    net.fit(train, valid=test)
    path = tmp_path / "net.npz"
    path.write_bytes(b"old contents")
    net.save(path)
    assert sorted(os.listdir(tmp_path)) == ["net.npz"]     # no temporary file left behind
    loaded = Network.load(path)
    assert loaded.config.to_dict() == net.config.to_dict()
    assert loaded.resolved_sampling == net.resolved_sampling
    np.testing.assert_array_equal(loaded.label_counts, net.label_counts)
    assert loaded.evaluate(test) == net.evaluate(test)
    assert loaded.history.records == net.history.records
    with pytest.raises(FileNotFoundError):
        net.save(tmp_path / "no" / "such" / "dir.npz")
    assert sorted(os.listdir(tmp_path)) == ["net.npz"]


def test_load_rejects_bad_files(data, tmp_path):
    train, _ = data
    net = small(epochs=1)
    net.fit(train)
    good = tmp_path / "good.npz"
    net.save(good)
    raw = good.read_bytes()
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.npz"):
        Network.load(trunc)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 1000)
    with pytest.raises(ValueError, match="junk.npz"):
        Network.load(junk)
    other = tmp_path / "other.npz"
    np.savez(other, a=np.arange(3))
    with pytest.raises(ValueError, match="other.npz.*not a slide network"):
        Network.load(other)
    # same file with another format version
    newer = tmp_path / "newer.npz"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(newer, "w") as zout:
        for item in zin.infolist():
            body = zin.read(item.filename)
            if item.filename == "meta.npy":
                body = body.replace(f'"format_version": {FORMAT_VERSION}'.encode(),
                                    f'"format_version": {FORMAT_VERSION + 1}'.encode())
            zout.writestr(item, body)
    with pytest.raises(ValueError, match=r"newer.npz.*format version 2"):
        Network.load(newer)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        Network.load(tmp_path / "missing.npz")


def test_early_stopping_restores_best_epoch(data):
    train, test = data
    # a tiny training set and a large learning rate overfit after a few epochs
    tiny = (train[0][:120], train[1][:120])
    net = small(epochs=12, lr=0.05, patience=2, batch_size=16, hidden=64)
    hist = net.fit(tiny, valid=test)
    scores = hist["valid/P@1"]
    best = int(np.argmax(scores))
    assert hist.best_score == scores[best]
    assert hist.best_epoch == hist.records[best]["epoch"]
    if hist.stopped_early:
        assert len(scores) == best + 1 + 2        # patience evaluations after the best
    # the restored network alone scores the best P@1; with the label-centroid term chosen on the
    # same points (centroid_weight: auto) it scores what the choice measured
    assert hist.centroid_search[0.0] == pytest.approx(hist.best_score, abs=1e-12)
    assert net.evaluate(test)["P@1"] == pytest.approx(hist.centroid_search[hist.centroid_weight], abs=1e-12)
    assert hist.restored_best


def test_the_copy_of_the_best_weights_is_written_over_in_place(data):
    """restore_best keeps one copy of the best weights and moments, overwritten at each new best
    (a second copy beside it would hold the model three times at its peak), and puts it back."""
    train, test = data
    arrays, best = [], {}

    class Watch(callbacks.Callback):
        def on_evaluate(self, net, rec):
            if net._best_step == net.step:   # a new best validation P@1
                arrays.append({k: id(v) for k, v in net._best_params.items()})
                best.update({k: np.array(v) for k, v in net._core.parameters().items()})

    net = small(epochs=10, lr=0.03, patience=0)
    hist = net.fit(train, valid=test, callbacks=[Watch()])
    assert len(arrays) >= 3 and all(a == arrays[0] for a in arrays)
    assert hist.best_epoch < 10 and hist.restored_best    # the last epoch was not the best
    now = net._core.parameters()
    assert sorted(now) == sorted(best)
    for k in best:
        np.testing.assert_array_equal(now[k], best[k], err_msg=k)


@pytest.mark.parametrize("first", [dict(epochs=3), dict(epochs="auto", refit=False, max_epochs=3, ensemble=1)])
def test_training_on_without_validation_keeps_what_it_learns(data, first):
    """A network whose earlier fit kept a copy of its best weights (restore_best) trains on
    without validation data: the new epochs change it, and no older copy is put back."""
    train, test = data
    net = small(lr=0.03, **first)
    hist = net.fit(train, valid=test if first["epochs"] == 3 else None)
    assert hist.restored_best and net._best_params is None   # the copy is freed once put back
    before = {k: np.array(v) for k, v in net._core.parameters().items()}
    hist = net.fit(train, epochs=net.epoch + 2)
    assert not hist.restored_best and net._best_params is None
    after = net._core.parameters()
    assert all(not np.array_equal(after[k], before[k]) for k in ("layers.0.weight", "layers.1.weight"))


def test_the_best_weights_are_kept_across_fits_without_a_copy_in_between(data, tmp_path):
    """After restore_best the network holds its best weights and no copy of them (nor does its
    file); a later fit with validation data that trains nothing better puts them back."""
    train, test = data
    net = small(epochs=10, lr=0.03, patience=0)
    first = net.fit(train, valid=test)
    assert first.restored_best and first.best_epoch < 10 and net._best_params is None
    best = {k: np.array(v) for k, v in net._core.parameters().items()}
    path = tmp_path / "best.npz"
    net.save(path)
    with zipfile.ZipFile(path) as z:
        assert not [n for n in z.namelist() if n.startswith("best/")]
    for again in (net, Network.load(path)):
        hist = again.fit(train, valid=test, epochs=again.epoch + 2)
        assert hist.best_epoch == first.best_epoch and hist.restored_best    # no better epoch
        now = again._core.parameters()
        for k in best:
            np.testing.assert_array_equal(now[k], best[k], err_msg=k)


def test_a_finished_auto_run_says_that_fit_trains_nothing_more(data):
    train, _ = data
    net = small(epochs="auto", max_epochs=3, ensemble=1)
    net.fit(train)
    step = net.step
    with pytest.warns(UserWarning, match=r"finished its epochs='auto' training, so nothing more was trained; "
                                         r"fit\(train, epochs=net.epoch \+ N\)"):
        hist = net.fit(train)
    assert net.step == step and not hist.records
    net.fit(train, epochs=net.epoch + 1)     # a count trains on
    assert net.step > step


def test_training_data_without_a_label_is_refused(data):
    train, _ = data
    with pytest.raises(ValueError, match="train: none of its 450 points has a label; there is nothing to learn"):
        small(epochs=1).fit((train[0], sp.csr_matrix(train[1].shape, dtype=np.float32)))


def test_evaluate_needs_points(data):
    train, _ = data
    net = small(epochs=1)
    net.fit(train)
    with pytest.raises(ValueError, match="evaluate: the data has no points"):
        net.evaluate((train[0][:0], train[1][:0]))
    assert net.predict(train[0][:0], k=2)[0].shape == (0, 2)   # predicting nothing is fine


def test_held_out_validation_fraction(data):
    train, _ = data
    net = small(epochs=1, valid_fraction=0.2)
    hist = net.fit(train)
    assert "valid/P@1" in hist.records[0]
    assert int(net.label_counts.sum()) < int(train[1].sum())   # counts from the 80% trained on
    assert net.step == int(np.ceil(360 / 32))


def test_eval_every_and_lr_schedule(data):
    train, _ = data
    net = small(epochs=2, eval_every=5, warmup_steps=10, lr_decay=0.5, lr_decay_min_steps=1)
    hist = net.fit(train, valid=(train[0][:50], train[1][:50]))
    steps = [r["step"] for r in hist.records]
    assert steps == [5, 10, 15, 20, 25, 30]
    assert hist.records[0]["lr"] == pytest.approx(0.01 * 5 / 10)
    assert hist.records[1]["lr"] == pytest.approx(0.01)
    assert hist.records[-1]["lr"] == pytest.approx(0.005)
    assert hist.records[0]["epoch"] == pytest.approx(5 / 15)


def test_lr_decay_waits_for_enough_batches_when_epochs_are_short(data):
    train, _ = data
    # 15 batches per epoch, decay at most once per 30 batches: half a decay per epoch
    hist = small(epochs=3, lr_decay=0.5, lr_decay_min_steps=30).fit(train)
    assert [r["lr"] for r in hist.records] == pytest.approx([0.01, 0.01 * 0.5 ** 0.5, 0.005])


def test_epochs_auto_searches_on_a_held_out_split_then_refits_on_all_of_train(data):
    train, test = data
    net = small(epochs="auto", max_epochs=40, patience=3, ensemble=1)
    hist = net.fit(train, test=test)
    search = [r for r in hist.records if r["phase"] == "search"]
    refit = [r for r in hist.records if r["phase"] == "refit"]
    assert search and refit and "valid/P@1" in search[0] and "valid/P@1" not in refit[0]
    best = int(np.argmax([r["valid/P@1"] for r in search]))
    assert hist.best_epoch == search[best]["epoch"] and hist.refit_epochs == best + 1
    assert len(refit) == hist.refit_epochs and net.epoch == hist.refit_epochs
    # the search stopped `patience` evaluations after its best one, and no fewer than 100 batches
    # (2 x lr_decay_min_steps; 12 batches an epoch here), or at max_epochs
    after_best = max(3, int(np.ceil(100 / 12)))
    assert hist.stopped_early == (len(search) < 40) and len(search) in (best + 1 + after_best, 40)
    # the refit replays the search's learning rates, epoch by epoch, on all 450 points
    assert [r["lr"] for r in refit] == [r["lr"] for r in search[:len(refit)]]
    assert net.step == hist.refit_epochs * int(np.ceil(450 / 32))
    assert net.total_steps == net.step + search[-1]["step"]
    assert refit[-1]["step"] == net.total_steps
    assert net.evaluate(test)["P@1"] == pytest.approx(refit[-1]["test/P@1"], abs=1e-12)


def test_patience_samples_ends_a_search_that_waited_that_many_samples(data):
    train, _ = data
    # 15 batches of 32 an epoch, patience 10 evaluations, at least 20 batches after the best
    # (2 x lr_decay_min_steps); patience_samples of 1,000 samples is 32 batches: then
    # PATIENCE_MIN_EVALS (3) evaluations after the best, not 10
    waits = {}
    for cap in (1000, 0):
        net = small(epochs="auto", max_epochs=80, patience=10, lr_decay_min_steps=10, ensemble=1,
                    valid_fraction=0.2, refit=False)
        net.config.training.patience_samples = cap
        hist = net.fit(train)
        scores = [r["valid/P@1"] for r in hist.records]
        best = int(np.argmax(scores))
        assert hist.stopped_early, cap
        waits[cap] = len(scores) - (best + 1)
    assert waits == {1000: 3, 0: 10}
    assert slide.Config().training.patience_samples == 250_000


def test_epochs_auto_without_refit_keeps_the_best_search_weights(data):
    train, _ = data
    net = small(epochs="auto", max_epochs=30, patience=3, refit=False, valid_fraction=0.25, ensemble=1)
    hist = net.fit(train)
    assert all(r["phase"] == "search" for r in hist.records) and hist.restored_best
    rows = np.sort(np.random.default_rng([3, 0x7A11D]).permutation(450)[:112])  # seed 3, as small()
    assert hist.centroid_search[0.0] == pytest.approx(hist.best_score, abs=1e-12)
    assert net.evaluate((train[0][rows], train[1][rows]))["P@1"] == pytest.approx(
        hist.centroid_search[hist.centroid_weight], abs=1e-12)


def test_epochs_auto_is_resumable_in_either_phase(data, tmp_path):
    train, test = data
    whole = small(epochs="auto", max_epochs=25, patience=3, ensemble=1)
    whole.fit(train)
    for stop_at in (3, whole.total_steps - 4):
        net = small(epochs="auto", max_epochs=25, patience=3, ensemble=1)
        with pytest.raises(KeyboardInterrupt):
            net.fit(train, callbacks=[_InterruptAt(stop_at)])
        net.save(tmp_path / "n.slide")
        again = slide.Network.load(tmp_path / "n.slide")
        again.fit(train)
        assert again.total_steps == whole.total_steps
        for k, v in whole.parameters().items():
            np.testing.assert_array_equal(again.parameters()[k], v)


class _InterruptAt(callbacks.Callback):
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, net, step, loss):
        if net.total_steps == self.step:
            raise KeyboardInterrupt


def test_epochs_must_be_a_count_or_auto():
    with pytest.raises(slide.ConfigError, match="training.epochs: expected an integer or auto"):
        slide.Network(epochs="forever")


class Recorder(callbacks.Callback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, net):
        self.events.append("begin")

    def on_batch_end(self, net, step, loss):
        assert np.isfinite(loss)
        self.events.append("batch")

    def on_evaluate(self, net, record):
        self.events.append("eval")

    def on_epoch_end(self, net, epoch):
        self.events.append(f"epoch{epoch}")

    def on_train_end(self, net, history):
        self.events.append("end")


def test_callbacks_order_and_stop(data):
    train, test = data
    rec = Recorder()
    small(epochs=2).fit(train, test=test, callbacks=[rec])
    assert rec.events == (["begin"] + ["batch"] * 15 + ["eval", "epoch1"]
                          + ["batch"] * 15 + ["eval", "epoch2", "end"])

    class StopAtEpoch(callbacks.Callback):
        def on_epoch_end(self, net, epoch):
            net.stop_training = True

    net = small(epochs=5)
    net.fit(train, callbacks=[StopAtEpoch()])
    assert net.epoch == 1


def test_keyboard_interrupt_leaves_network_usable(data, tmp_path):
    train, test = data
    rec = Recorder()

    class Interrupt(callbacks.Callback):
        def on_batch_end(self, net, step, loss):
            if step == 7:
                raise KeyboardInterrupt

    net = small(epochs=3)
    with pytest.raises(KeyboardInterrupt):
        net.fit(train, callbacks=[rec, Interrupt()])
    assert rec.events[-1] == "end" and net.history.interrupted
    assert net.step == 7 and net.epoch == 0
    assert net.predict(test[0], k=1)[0].shape == (150, 1)
    net.save(tmp_path / "int.npz")
    Network.load(tmp_path / "int.npz").fit(train)


def test_checkpoint_callback(data, tmp_path):
    train, _ = data
    path = tmp_path / "ck.npz"
    cb = callbacks.Checkpoint(path, every_epochs=1)
    small(epochs=2).fit(train, callbacks=[cb])
    assert cb.saved == 3 and Network.load(path).epoch == 2


def test_checkpoint_callback_auto_skips_epoch_ends_while_writing_is_costly(data, tmp_path, monkeypatch):
    train, _ = data
    path = tmp_path / "ck.npz"
    save = Network.save

    def slow_save(self, p):
        time.sleep(0.2)   # 0.2 s a write: the next epoch-end save waits at least 4 s
        save(self, p)

    monkeypatch.setattr(Network, "save", slow_save)
    cb = callbacks.Checkpoint(path, every_epochs="auto")
    small(epochs=3).fit(train, callbacks=[cb])
    assert cb.saved == 2 and Network.load(path).epoch == 3   # the first epoch's, then the end's
    with pytest.raises(ValueError, match="every_epochs must be >= 0 or 'auto', got 'often'"):
        callbacks.Checkpoint(path, every_epochs="often")


def test_memory_estimate_and_check():
    cfg = Network(hidden=128).config
    est = slide.memory.estimate(cfg, 100_000, 670_000)
    assert set(est) == {"weights", "adam", "gradients", "hash_tables", "batch", "centroids", "label_vectors",
                        "best_copy", "total"}
    # epochs auto refits on all of train: no copy of the best weights is kept
    assert est["best_copy"] == 0
    # centroid_weight auto on a wide layer: at most 32 entries a label (slide.centroids), and each
    # thread's scratch of a float and a byte a label for the pools (slide._core.label_pools)
    threads = slide._core.default_threads()
    assert est["centroids"] == 670_000 * 32 * 8 + 100_001 * 8 + threads * 670_000 * 5
    assert slide.memory.estimate(Network(hidden=128, threads=3).config, 100_000, 670_000)["centroids"] == \
        670_000 * 32 * 8 + 100_001 * 8 + 3 * 670_000 * 5
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    # 100K x 128 + 128 x 670K weights (and biases), float32
    assert est["weights"] == 4 * (100_000 * 128 + 128 + 128 * 670_000 + 670_000)
    assert est["adam"] == 2 * est["weights"]
    assert est["hash_tables"] > 0
    assert est["gradients"] == 4 * (100_000 + 670_000)  # per-row offsets of the gradient records
    dense = slide.memory.estimate(cfg, 100_000, 670_000, sampling=["dense", "dense"])
    assert dense["hash_tables"] == 0 and dense["batch"] > est["batch"]
    # a dense 670K-wide layer also needs a gradient buffer of its own size
    assert dense["gradients"] == 4 * (100_000 + 128 * 670_000 + 670_000)
    with pytest.raises(MemoryError, match=r"needs about .* only 1.0 MiB of memory is available"):
        slide.memory.check_fits(Config(), 100_000, 670_000, available=1 << 20)


@pytest.mark.parametrize("training, data, kept", [
    ({"epochs": 5}, {}, False),                                   # no validation data
    ({"epochs": 5}, {"valid_fraction": 0.1}, True),               # restore_best with a split
    ({"epochs": 5}, {"valid": "valid.txt"}, True),
    ({"epochs": 5, "restore_best": False}, {"valid_fraction": 0.1}, False),
    ({}, {}, False),                                              # epochs auto: refit on all of train
    ({"refit": False}, {}, True),                                 # ... or keep the search's best
    ({}, {"valid": "valid.txt"}, True),                           # a validation file: no refit
])
def test_memory_estimate_counts_the_copy_of_the_best_weights(training, data, kept):
    cfg = Config.from_dict({"training": training, "data": data})
    est = slide.memory.estimate(cfg, 50_000, 20_000)
    assert slide.memory.keeps_best_copy(cfg) is kept
    assert est["best_copy"] == (est["weights"] + est["adam"] if kept else 0)
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    if kept:
        with pytest.raises(MemoryError, match=r"training.restore_best: false saves the copy of the best weights"):
            slide.memory.check_fits(cfg, 50_000, 20_000, available=1 << 20)


def test_fit_checks_memory_with_the_copy_of_the_best_weights(data, monkeypatch):
    """fit sizes the copy from what it knows: a validation set given to fit keeps one."""
    seen = []
    check = slide.memory.check_fits
    monkeypatch.setattr(slide.memory, "check_fits", lambda *a, **kw: seen.append(kw["best_copy"]) or check(*a, **kw))
    train, test = data
    small(epochs=1).fit(train, valid=test)
    small(epochs=1).fit(train)
    small(epochs=1, restore_best=False).fit(train, valid=test)
    assert seen == [True, False, False]


@pytest.mark.parametrize("num_labels", [50, 30_000])
def test_memory_estimate_agrees_with_the_engine(num_labels):
    net = Network(hidden=64, threads=1, num_features=1000, num_labels=num_labels)
    assert net.resolved_sampling == ["dense", "dense" if num_labels == 50 else "lsh"]
    est = slide.memory.estimate(net.config, 1000, num_labels, sampling=net.resolved_sampling)
    report = net.memory_report()
    assert est["weights"] == report["weights"] and est["adam"] == report["optimizer"]
    assert report["tables"] <= est["hash_tables"] <= 1.5 * report["tables"]


@pytest.mark.parametrize("num_labels", [300, 40_000])
def test_memory_estimate_covers_a_trained_batch(num_labels):
    """After training (the 40K-label LSH layer adds the batch's labels as negatives), the
    engine's gradient records and scratch stay within the estimate's gradients + batch."""
    from slide.datasets import make_synthetic

    train, _ = make_synthetic(num_features=2000, num_labels=num_labels, num_train=512, num_test=1,
                              avg_labels=6, avg_nnz=30)
    net = Network(hidden=64, threads=2, batch_size=256, epochs=1)
    net.fit(train)
    est = slide.memory.estimate(net.config, train.num_features, num_labels, sampling=net.resolved_sampling)
    report = net.memory_report()
    assert report["gradients"] + report["scratch"] <= est["gradients"] + est["batch"]


def test_fit_checks_memory_before_allocating(data, monkeypatch):
    import psutil

    class Tiny:
        available = 1 << 16
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny())
    net = small()
    with pytest.raises(MemoryError, match="available"):
        net.fit(data[0])
    assert not net.built


def test_two_networks_are_independent(data):
    train, test = data
    a = small(epochs=1, seed=1)
    b = small(epochs=1, seed=2)
    a.fit(train)
    before = params_of(a)
    b.fit(train)
    after = params_of(a)
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    assert not np.array_equal(a.predict(test[0])[1], b.predict(test[0])[1])


def test_eval_samples_limits_evaluation(data):
    train, test = data
    hist = small(epochs=1, eval_samples=40).fit(train, test=test)
    # P@1 over 40 points moves in steps of 1/40
    assert hist.records[0]["test/P@1"] * 40 == pytest.approx(round(hist.records[0]["test/P@1"] * 40))


def test_progress_bar_reports_samples_and_loss(data):
    import io

    train, test = data
    out = io.StringIO()
    small(epochs=1).fit(train, test=test, callbacks=[callbacks.ProgressBar(file=out)])
    text = out.getvalue()
    assert "450/450" in text and "loss" in text


def test_progress_to_a_file_is_whole_lines_with_the_refit_total(data):
    """A log file gets lines, not a bar's carriage returns; epochs=auto shows the search, then
    the refit with its known total (an ETA)."""
    import io

    from tqdm import tqdm

    train, _ = data
    out = io.StringIO()   # not a terminal
    net = Network({"optimizer": {"lr_search": []}}, hidden=32, batch_size=32, lr=0.01, threads=1, seed=3,
                  epochs="auto", max_epochs=6, patience=2, ensemble=1)
    net.fit(train, callbacks=[callbacks.ProgressBar(file=out, log_every=0.0)])
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    phases = [line.split(":")[0] for line in lines]
    assert phases[0] == "search" and phases[-1] == "refit"
    assert phases == sorted(phases, key=["search", "refit"].index)   # the search's lines, then the refit's
    assert all("samples/s" in line for line in lines)
    total = tqdm.format_sizeof(net.history.refit_epochs * 450)    # 2.70k
    assert "%" not in lines[0] and f" 100% {total}/{total} [" in lines[-1]
    assert sum(f"/{total} [" in line for line in lines) == sum(p == "refit" for p in phases)
    # at the refit's total it writes its last line at once, and nothing more at the end of training
    assert lines.count(lines[-1]) == 1


def test_progress_to_a_file_writes_a_line_every_log_every_seconds(data, monkeypatch):
    import io

    train, _ = data
    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])

    class Tick(callbacks.Callback):
        def on_batch_end(self, net, step, loss):
            clock[0] += 1.0            # each batch takes a second

    out = io.StringIO()
    small(epochs=2).fit(train, callbacks=[Tick(), callbacks.ProgressBar(file=out, log_every=10.0)])
    lines = out.getvalue().splitlines()
    # 15 batches an epoch (14 of 32 samples, one of 2): a line after 10 and 20 s, and at the total
    assert [line.split(" [")[0] for line in lines] == ["train: 36% 320/900", "train: 68% 610/900",
                                                       "train: 100% 900/900"]
    assert "[00:30<00:00" in lines[-1] and "epoch=2" in lines[-1]   # the epoch being trained


def test_ctrl_c_during_training_stops_cleanly(data, tmp_path):
    import _thread
    import threading

    train, test = data
    net = small(epochs=10_000)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            net.fit(train)
    finally:
        timer.cancel()
    assert net.history.interrupted and 0 < net.step < 10_000 * 15
    assert net.step == net.epoch * 15 + net._batch_in_epoch     # no half-counted batch
    assert net.predict(test[0], k=2)[0].shape == (150, 2)
    net.save(tmp_path / "stopped.npz")
    assert Network.load(tmp_path / "stopped.npz").step == net.step


@pytest.mark.slow
def test_lsh_layer_a_few_times_wider_than_its_active_set_keeps_up_with_dense():
    """3,000 labels, at most 600 active: the batch's labels join the active sets as negatives.
    Without them the frequent labels are pushed up as positives far more often than down as
    negatives and the LSH layer trails the dense one (measured: 0.53 against 0.66 test P@1)."""
    from slide.datasets import make_synthetic

    train, test = make_synthetic(num_features=5000, num_labels=3000, num_train=12000, num_test=1000,
                                 avg_labels=3, avg_nnz=40)
    scores = {}
    for sampling in ("dense", "lsh"):
        cfg = {"layers": [{"size": 64},
                          {"size": None, "activation": "softmax", "sampling": sampling,
                           "lsh": {"family": "dwta", "K": 4, "L": 16, "bucket_capacity": 32,
                                   "min_active": 200, "max_active": 600}}],
               "training": {"threads": 1, "batch_size": 128, "epochs": 4, "dropout": 0.0},
               "optimizer": {"lr": 3e-3, "lr_decay": 1.0}}
        net = Network(cfg)
        net.fit(train)
        assert net.resolved_sampling[-1] == sampling
        scores[sampling] = net.evaluate(test)["P@1"]
    most_frequent = np.bincount(train.labels.indices, minlength=3000).argmax()
    baseline = float((test.labels[:, most_frequent].toarray() > 0).mean())
    assert scores["dense"] > baseline + 0.3, (scores, baseline)
    assert scores["lsh"] >= scores["dense"] - 0.04, scores


def test_time_budget_stops_training_and_says_so(data):
    train, _ = data
    net = small(epochs=10_000, time_budget=0.2)
    hist = net.fit(train)
    assert hist.stopped_by_budget and 0 < net.epoch < 10_000
    assert hist.records[-1]["seconds"] < 0.2 + 1.0   # stops within an epoch of the budget (short epochs)


def test_the_test_split_is_evaluated_about_twenty_times_a_long_phase_and_after_its_last_epoch(data):
    train, test = data
    hist = small(epochs=45, hidden=8, patience=0).fit(train, valid=test, test=test)
    assert [r["epoch"] for r in hist.records] == list(range(1, 46))          # valid: every epoch
    assert all("valid/P@1" in r for r in hist.records)
    tested = [r["epoch"] for r in hist.records if "test/P@1" in r]
    assert tested == list(range(3, 46, 3))                                    # ceil(45 / 20) = 3
    # where the test split was not evaluated the unprefixed keys are the validation split's
    assert hist.records[0]["P@1"] == hist.records[0]["valid/P@1"]
    assert all(r["P@1"] == r["test/P@1"] for r in hist.records if "test/P@1" in r)
    # a phase of at most 20 epochs, or test_every 1: every epoch; a count not divisible: the last too
    assert all("test/P@1" in r for r in small(epochs=20, hidden=8).fit(train, test=test).records)
    assert all("test/P@1" in r for r in small(epochs=25, hidden=8, test_every=1).fit(train, test=test).records)
    hist = small(epochs=7, hidden=8, test_every=3).fit(train, test=test)
    assert [r["epoch"] for r in hist.records if "test/P@1" in r] == [3, 6, 7]
    # evaluations every eval_every batches (mid-epoch) always score it
    hist = small(epochs=25, hidden=8, eval_every=5, patience=0).fit(train, test=test)
    mid = [r for r in hist.records if r["epoch"] != int(r["epoch"])]
    assert mid and all("test/P@1" in r for r in mid)
    assert [r["epoch"] for r in hist.records if r["epoch"] == int(r["epoch"]) and "test/P@1" in r] == \
        list(range(2, 25, 2)) + [25]                                          # ceil(25 / 20) = 2
    with pytest.raises(ConfigError, match=r"training\.test_every"):
        small(test_every=0)


def test_auto_skips_test_evaluations_over_their_share_of_the_training_time(data, monkeypatch):
    """test_every auto (display only) skips an evaluation of the test split while the fit's test
    evaluations have taken more than TEST_SHARE of its training seconds beyond TEST_FREE_SECONDS;
    the last epoch is always evaluated, and a set test_every is kept as it is."""
    from slide import _epochs

    train, test = data
    monkeypatch.setattr(_epochs, "TEST_FREE_SECONDS", 0.0)
    monkeypatch.setattr(_epochs, "TEST_SHARE", 0.0)   # any evaluation is over the share
    hist = small(epochs=6, hidden=8).fit(train, test=test)
    assert [r["epoch"] for r in hist.records if "test/P@1" in r] == [1, 6]
    assert [r["epoch"] for r in hist.records] == [1, 2, 3, 4, 5, 6]    # a record each epoch still
    hist = small(epochs=6, hidden=8, test_every=2).fit(train, test=test)
    assert [r["epoch"] for r in hist.records if "test/P@1" in r] == [2, 4, 6]
    monkeypatch.setattr(_epochs, "TEST_SHARE", 1e9)   # a share no evaluation passes: every epoch
    hist = small(epochs=6, hidden=8).fit(train, test=test)
    assert [r["epoch"] for r in hist.records if "test/P@1" in r] == [1, 2, 3, 4, 5, 6]


def test_an_early_search_best_gives_way_to_the_first_evaluation_after_one_decay_period():
    """epochs=auto: a best booked before optimizer.lr_decay_min_steps steps (an early network that
    ranks frequent labels first on a small validation split) does not hold the search's best past
    that point; outside the search (a count of epochs) the best is kept as measured."""
    from slide.history import History

    for phase, reset in (("search", True), ("train", False)):
        net = slide.Network(num_features=4, num_labels=3, hidden=4, threads=1)
        net._phase, net._snapshot_best = phase, False
        h = History()
        marks = [(6, 0.8, 2, True), (30, 0.7, 10, False), (51, 0.6, 17, reset), (60, 0.65, 20, reset)]
        for step, score, epoch, new_best in marks:
            net._core.step = step
            assert net._track_best(score, epoch, h) is new_best, (phase, step)
        assert (net._best_score, net._best_epoch) == ((0.65, 20) if reset else (0.8, 2))
