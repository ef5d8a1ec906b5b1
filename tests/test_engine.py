"""The training engine through its binding, slide._core.Network."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from slide._core import Network as CoreNetwork

# The engine takes no defaults: every key of the spec is required (tests below check that), but
# a layer's precision (optional, fp32) and negative_weight (optional, default 1).
# The tests here state only what they vary; complete() fills the rest from these values.
TOP_KEYS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, dropout=0.0, threads=0, seed=0,
                rebuild_first=50, rebuild_decay=0.1, hugepages=True, recompute=False)
LAYER_KEYS = dict(activation="relu", sampling="dense", family="dwta", K=6, L=50, range_pow=0, bucket_capacity=128,
                  bucket_policy="fifo", bin_size=8, selection="vanilla", threshold=2, min_active=1000,
                  max_active=4000, precision="fp32", negative_weight=1.0)


def complete(spec):
    """spec with every key the engine requires (input_dim, layers and sizes are left as given)."""
    out = dict(TOP_KEYS, **spec)
    if isinstance(spec.get("layers"), list):
        out["layers"] = [dict(LAYER_KEYS, **l) if isinstance(l, dict) else l for l in spec["layers"]]
    return out


def Network(spec):
    return CoreNetwork(complete(spec))


# ---------------------------------------------------------------------- helpers

def make_problem(n=1200, D=400, C=16, seed=0, multilabel=False):
    """A separable sparse problem: each class owns a few features, plus noise features."""
    rng = np.random.default_rng(seed)
    owned = rng.permutation(D)[: C * 6].reshape(C, 6)
    y = rng.integers(0, C, size=n)
    ind, val, ptr = [], [], [0]
    yind, yptr = [], [0]
    for i in range(n):
        f = np.unique(np.concatenate([owned[y[i]][rng.random(6) < 0.8], rng.integers(0, D, 3)]))
        v = (rng.random(len(f)) + 0.5).astype(np.float32)
        v /= np.linalg.norm(v)
        ind.append(f)
        val.append(v)
        ptr.append(ptr[-1] + len(f))
        labs = [y[i]] + ([int((y[i] + 1) % C)] if multilabel else [])
        yind.extend(labs)
        yptr.append(len(yind))
    x = (np.array(ptr, np.int64), np.concatenate(ind).astype(np.int32), np.concatenate(val).astype(np.float32))
    lab = (np.array(yptr, np.int64), np.array(yind, np.int32))
    return x, lab, y


def spec(D=400, C=16, hidden=32, sampling="dense", threads=1, seed=3, **extra):
    out = dict(size=C, activation="softmax", sampling=sampling)
    if sampling == "lsh":
        out.update(family="dwta", K=2, L=8, min_active=4, max_active=8, bucket_capacity=64)
    out.update(extra.pop("out", {}))
    s = dict(input_dim=D, layers=[dict(size=hidden, activation="relu"), out], threads=threads, seed=seed,
             rebuild_first=4, rebuild_decay=0.2)
    s.update(extra)
    return s


def train(net, x, lab, epochs=3, batch=64, lr=1e-2, seed=0):
    rng = np.random.default_rng(seed)
    n = len(x[0]) - 1
    losses = []
    for _ in range(epochs):
        perm = rng.permutation(n).astype(np.int64)
        for s in range(0, n, batch):
            losses.append(net.train_batch(*x, *lab, perm[s:s + batch], lr))
    return losses


def params_copy(net):
    return {k: v.copy() for k, v in net.parameters().items()}


PROBLEM = make_problem()


# ---------------------------------------------------------------------- learning

@pytest.mark.parametrize("sampling", ["dense", "lsh"])
def test_learns_a_separable_problem(sampling):
    x, lab, y = PROBLEM
    net = Network(spec(sampling=sampling))
    losses = train(net, x, lab, epochs=4)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3])
    top, scores = net.predict_topk(*x, 3)
    assert top.dtype == np.int32 and scores.dtype == np.float32 and top.shape == (len(y), 3)
    assert (top[:, 0] == y).mean() > 0.9
    assert np.all(np.diff(scores, axis=1) <= 0) and np.all(scores > 0) and np.all(scores.sum(1) <= 1 + 1e-5)
    if sampling == "lsh":
        top_lsh, s_lsh = net.predict_topk(*x, 1, mode="lsh")
        assert (top_lsh[:, 0] == y).mean() > 0.7
    assert net.step == len(losses)


@pytest.mark.parametrize("layers", [
    # hash-sampled hidden layer, a dense hidden layer after it (lock-free accumulation), dropout
    [dict(size=32), dict(size=48, sampling="lsh", family="simhash", K=3, L=6, min_active=16, max_active=0),
     dict(size=24, activation="linear"), dict(size=16, activation="softmax")],
    # one layer: the sparse input straight into the softmax
    [dict(size=16, activation="softmax")],
    # a wide layer 0 (its gradient goes through lock-free buffers, not per-sample records)
    [dict(size=5000, activation="softmax")],
])
def test_other_architectures_learn(layers):
    x, lab, y = PROBLEM
    net = Network(dict(input_dim=400, layers=layers, threads=2, seed=1, dropout=0.1 if len(layers) > 2 else 0.0))
    losses = train(net, x, lab, epochs=4)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3])
    top, _ = net.predict_topk(*x, 1)
    assert (top[:, 0] == y).mean() > 0.85


def test_multilabel_and_unlabeled_samples():
    x, lab, y = make_problem(n=600, multilabel=True, seed=1)
    yptr, yind = lab
    # Drop the labels of sample 0: it trains with loss 0 and must not break anything.
    yind = yind[2:]
    yptr = np.concatenate([[0], yptr[1:] - 2]).astype(np.int64)
    net = Network(spec(threads=2))
    assert net.num_threads == 2
    loss0 = net.train_batch(*x, yptr, yind, np.array([0], np.int64), 1e-2)
    assert loss0 == 0.0
    losses = train(net, x, (yptr, yind), epochs=4)
    assert losses[-1] < losses[0]
    top, _ = net.predict_topk(*x, 2)
    hits = [(top[i, 0] in (y[i], (y[i] + 1) % 16)) for i in range(1, len(y))]
    assert np.mean(hits) > 0.9


# 16 dense: matrix products over blocks of samples; 16 lsh: one sample at a time; 5000: blocked
# wide-layer path. 300 samples: more than one block of 128 (and of the wide path's 64); 7 and
# 301: blocks whose samples are not a multiple of the 4 that the wide path's kernels take at once;
# 30 hidden units: rows that are not a multiple of the 8 floats its vector kernels take.
@pytest.mark.parametrize("C, sampling, n, hidden", [(16, "dense", 300, 32), (16, "lsh", 300, 32),
                                                    (5000, "dense", 300, 32), (5000, "dense", 7, 32),
                                                    (5000, "dense", 301, 32), (5000, "dense", 301, 30)])
def test_predict_exact_matches_numpy_forward(C, sampling, n, hidden):
    x, lab, _ = PROBLEM
    net = Network(spec(sampling=sampling, threads=2, C=C, hidden=hidden))
    train(net, x, lab, epochs=1)
    p = net.parameters()
    ptr, ind, val = x
    X = np.zeros((n, 400), np.float32)
    for i in range(n):
        X[i, ind[ptr[i]:ptr[i + 1]]] = val[ptr[i]:ptr[i + 1]]
    h = np.maximum(X @ p["layers.0.weight"] + p["layers.0.bias"], 0)
    z = h @ p["layers.1.weight"].T + p["layers.1.bias"]
    prob = np.exp(z - z.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    ref = np.argsort(-prob, axis=1)[:, :5]
    top, scores = net.predict_topk(ptr[: n + 1], ind, val, 5)
    np.testing.assert_array_equal(top, ref)
    np.testing.assert_allclose(scores, np.take_along_axis(prob, ref, 1), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------- determinism and isolation

@pytest.mark.parametrize("sampling", ["dense", "lsh"])
def test_one_thread_same_seed_is_bit_identical(sampling):
    x, lab, _ = PROBLEM
    runs = []
    for _ in range(2):
        net = Network(spec(sampling=sampling, dropout=0.2))
        losses = train(net, x, lab, epochs=1)
        runs.append((losses, params_copy(net), net.predict_topk(*x, 3, mode="lsh" if sampling == "lsh" else "exact")))
    assert runs[0][0] == runs[1][0]
    for k in runs[0][1]:
        assert np.array_equal(runs[0][1][k], runs[1][1][k]), k
    assert np.array_equal(runs[0][2][0], runs[1][2][0]) and np.array_equal(runs[0][2][1], runs[1][2][1])
    other = Network(spec(sampling=sampling, seed=4))
    assert not np.array_equal(other.parameters()["layers.1.weight"], runs[0][1]["layers.1.weight"])


@pytest.mark.parametrize("sampling", ["dense", "lsh"])
def test_result_does_not_depend_on_the_thread_count(sampling):
    """Sampled and narrow layers form row gradients from per-sample records in batch order."""
    x, lab, _ = PROBLEM
    runs = []
    for threads in (1, 2):
        net = Network(spec(sampling=sampling, threads=threads, dropout=0.1))
        train(net, x, lab, epochs=1)
        runs.append(params_copy(net))
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k


@pytest.mark.parametrize("weighted", [False, True])
def test_wide_sampled_layer_learns_and_does_not_depend_on_the_thread_count(weighted):
    """An output layer far wider than its active set adds the batch's labels as negatives (at
    most max_active of them, here fewer than the batch holds), weighted by their inclusion
    chances when the label frequencies are known, and a batch-shared random fill: it still
    learns, and the result is the same for any thread count."""
    x, lab, y = make_problem(n=1500, D=3000, C=400, multilabel=True)
    freq = (np.bincount(lab[1], minlength=400) / 1500).astype(np.float32)

    def make(threads=1):
        net = Network(spec(D=3000, C=400, sampling="lsh", threads=threads))
        if weighted:
            net.set_label_frequencies(freq)
        assert net.has_label_frequencies == weighted
        return net

    net = make()
    train(net, x, lab, epochs=6, lr=2e-2)
    top, _ = net.predict_topk(*x, 1)
    # Each point carries labels y and y + 1: the top label must be one of them.
    assert np.mean((top[:, 0] == y) | (top[:, 0] == (y + 1) % 400)) > 0.8
    runs = []
    for threads in (1, 2):
        net = make(threads)
        train(net, x, lab, epochs=1, lr=2e-2)
        runs.append(params_copy(net))
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k


def test_label_frequencies_weight_the_batch_negatives_and_are_checked():
    x, lab, _ = make_problem(n=600, D=3000, C=400, multilabel=True)
    freq = (np.bincount(lab[1], minlength=400) / 600).astype(np.float32)
    runs = []
    for f in (None, freq):
        net = Network(spec(D=3000, C=400, sampling="lsh"))
        if f is not None:
            net.set_label_frequencies(f)
        train(net, x, lab, epochs=1, lr=2e-2)
        runs.append(net.parameters()["layers.1.weight"].copy())
    assert not np.array_equal(runs[0], runs[1])   # the weights change what is learned
    net = Network(spec(D=3000, C=400, sampling="lsh"))
    with pytest.raises(ValueError, match=r"expected 400 values \(one per label\), got 399"):
        net.set_label_frequencies(freq[:-1])
    bad = freq.copy()
    bad[7] = 1.5
    with pytest.raises(ValueError, match=r"value 1.5.* of label 7 is not in \[0, 1\]"):
        net.set_label_frequencies(bad)
    bad[7] = np.nan
    with pytest.raises(ValueError, match="of label 7 is not in"):
        net.set_label_frequencies(bad)
    with pytest.raises(ValueError, match="freq: expected dtype float32"):
        net.set_label_frequencies(freq.astype(np.float64))
    assert not net.has_label_frequencies
    net.set_label_frequencies(freq)
    net.set_label_frequencies(np.zeros(0, np.float32))   # clears
    assert not net.has_label_frequencies


def test_resumed_run_continues_identically():
    x, lab, _ = PROBLEM
    rows = [np.arange(s, s + 32, dtype=np.int64) for s in range(0, 320, 32)]
    full = Network(spec(dropout=0.1))
    for r in rows:
        full.train_batch(*x, *lab, r, 1e-2)
    first = Network(spec(dropout=0.1))
    for r in rows[:5]:
        first.train_batch(*x, *lab, r, 1e-2)
    resumed = Network(spec(dropout=0.1))
    train(resumed, x, lab, epochs=1, seed=7)  # state that the load must fully overwrite
    for k, v in resumed.parameters().items():
        v[...] = first.parameters()[k]
    resumed.step = first.step
    resumed.rebuild_tables()
    for r in rows[5:]:
        resumed.train_batch(*x, *lab, r, 1e-2)
    assert resumed.step == full.step == 10
    for k, v in full.parameters().items():
        assert np.array_equal(v, resumed.parameters()[k]), k


def test_two_networks_in_one_process_are_independent():
    x, lab, _ = PROBLEM
    a, b = Network(spec(sampling="lsh")), Network(spec(sampling="lsh"))
    b_before = params_copy(b)
    train(a, x, lab, epochs=1)
    for k, v in b.parameters().items():
        assert np.array_equal(v, b_before[k]), k
    assert b.step == 0 and a.step > 0
    # Interleaved training gives the same result as training alone.
    c = Network(spec(sampling="lsh"))
    rng = np.random.default_rng(0)
    perm = rng.permutation(1200).astype(np.int64)
    for s in range(0, 1200, 64):
        b.train_batch(*x, *lab, perm[s:s + 64], 1e-2)
        c.train_batch(*x, *lab, perm[s:s + 64], 1e-2)
    assert all(np.array_equal(v, c.parameters()[k]) for k, v in b.parameters().items())
    assert all(np.array_equal(v, b.parameters()[k]) for k, v in a.parameters().items())


def test_concurrent_predict_from_python_threads():
    x, lab, _ = PROBLEM
    net = Network(spec(threads=2))
    train(net, x, lab, epochs=1)
    ref = net.predict_topk(*x, 3)
    results = [None] * 4

    def work(i):
        results[i] = net.predict_topk(*x, 3)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert np.array_equal(r[0], ref[0]) and np.array_equal(r[1], ref[1])


# ---------------------------------------------------------------------- parameters and sparse Adam

def test_parameter_views_round_trip():
    x, lab, _ = PROBLEM
    net = Network(spec(sampling="lsh"))
    train(net, x, lab, epochs=1)
    views = net.parameters()
    assert set(views) == {f"layers.{i}.{a}{s}" for i in (0, 1) for a in ("weight", "bias")
                          for s in ("", ".adam_m", ".adam_v")}
    assert views["layers.0.weight"].shape == (400, 32) and views["layers.1.weight"].shape == (16, 32)
    assert views["layers.1.bias"].shape == (16,) and views["layers.0.weight"].flags.writeable
    saved = params_copy(net)
    step = net.step
    before = net.predict_topk(*x, 3)
    train(net, x, lab, epochs=1, seed=5)
    changed = net.predict_topk(*x, 3)
    assert not np.array_equal(changed[1], before[1])
    for k, v in net.parameters().items():
        v[...] = saved[k]
    net.step = step
    net.rebuild_tables()
    after = net.predict_topk(*x, 3)
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    # The views are the network's memory, and keep it alive.
    w = net.parameters()["layers.1.bias"]
    del net, views
    w[:] = 0.0
    assert np.all(w == 0.0)


def test_untouched_rows_are_never_updated():
    """Sparse Adam: rows of absent features and of inactive output neurons keep weights and moments."""
    x, lab, _ = make_problem(n=100, multilabel=True, seed=4)
    # max_active=2 and min_active=0: each sample's active output set is its two labels.
    net = Network(spec(sampling="lsh", out=dict(min_active=0, max_active=2), weight_decay=0.01))
    rows = np.arange(0, 8, dtype=np.int64)
    net.train_batch(*x, *lab, rows, 1e-2)  # non-zero moments everywhere touched
    before = params_copy(net)
    batch = np.array([20, 21], np.int64)
    net.train_batch(*x, *lab, batch, 1e-2)
    after = net.parameters()
    ptr, ind, _ = x
    feats = np.unique(np.concatenate([ind[ptr[r]:ptr[r + 1]] for r in batch]))
    labels = np.unique(np.concatenate([lab[1][lab[0][r]:lab[0][r + 1]] for r in batch]))
    assert len(labels) == 4
    other_feats = np.setdiff1d(np.arange(400), feats)
    other_labels = np.setdiff1d(np.arange(16), labels)
    for s in ("", ".adam_m", ".adam_v"):
        w0, w1 = before["layers.0.weight" + s], after["layers.0.weight" + s]
        assert np.array_equal(w0[other_feats], w1[other_feats])
        assert np.all(np.any(w0[feats] != w1[feats], axis=1))
        o0, o1 = before["layers.1.weight" + s], after["layers.1.weight" + s]
        assert np.array_equal(o0[other_labels], o1[other_labels])
        assert np.all(np.any(o0[labels] != o1[labels], axis=1))
        b0, b1 = before["layers.1.bias" + s], after["layers.1.bias" + s]
        assert np.array_equal(b0[other_labels], b1[other_labels]) and np.all(b0[labels] != b1[labels])


def test_memory_report():
    net = Network(spec(sampling="lsh", hugepages=True))
    r = net.memory_report()
    for k in ("weights", "optimizer", "gradients", "tables", "scratch", "scratch_per_thread", "total", "hugepages"):
        assert k in r
    assert r["weights"] == 4 * (400 * 32 + 32 + 16 * 32 + 16)
    assert r["optimizer"] == 2 * r["weights"]
    assert r["tables"] > 0 and r["total"] >= r["weights"] + r["optimizer"] + r["tables"]
    assert isinstance(r["hugepages"], list)
    # Arrays of 1 MiB and more are hugepage candidates where the kernel offers THP.
    big = Network(dict(input_dim=5000, layers=[dict(size=64), dict(size=10, activation="softmax")]))
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else "[never]"
    if "[never]" not in thp:
        assert "layers.0.weight" in big.memory_report()["hugepages"]
    off = Network(dict(input_dim=5000, layers=[dict(size=64), dict(size=10, activation="softmax")], hugepages=False))
    assert off.memory_report()["hugepages"] == []
    assert big.kernel_isa in ("generic", "avx2", "avx512") and big.seed == 0 and big.num_threads >= 1


def test_rebuild_schedule_follows_step():
    x, lab, _ = PROBLEM
    net = Network(spec(sampling="lsh", rebuild_first=3, rebuild_decay=0.0))
    assert net.next_rebuild == 3
    rows = np.arange(8, dtype=np.int64)
    for _ in range(4):
        net.train_batch(*x, *lab, rows, 1e-2)
    assert net.next_rebuild == 6
    net.step = 100
    assert net.next_rebuild == 102
    assert Network(spec()).next_rebuild == -1


# ---------------------------------------------------------------------- bad input

def test_bad_spec_raises_value_error_naming_the_key():
    good = spec()
    cases = [
        ({k: v for k, v in good.items() if k != "input_dim"}, r"input_dim: missing"),
        (dict(good, input_dim=0), r"input_dim: must be >= 1"),
        (dict(good, input_dim="many"), r"input_dim: expected an integer"),
        (dict(good, lr=-1.0), r"optimizer\.lr: must be > 0"),
        (dict(good, dropout=1.0), r"training\.dropout"),
        (dict(good, beta1=1.0), r"optimizer\.betas: beta1"),
        (dict(good, learning_rate=0.1), r"learning_rate: unknown key"),
        (dict(good, layers=[]), r"layers: at least one"),
        (dict(good, layers=[dict(size=8, activation="softmax"), dict(size=4, activation="softmax")]),
         r"layers\.0\.activation"),
        (dict(good, layers=[dict(size=8), dict(size=4, activation="relu")]), r"layers\.1\.activation"),
        (dict(good, layers=[dict(size=8, sampling="lsh"), dict(size=4, activation="softmax")]),
         r"layers\.0\.sampling: lsh is not allowed"),
        (dict(good, layers=[dict(size=8), dict(activation="softmax")]), r"layers\.1\.size: missing"),
        (dict(good, layers=[dict(size=8), dict(size=4, activation="softmax", family="md5")]),
         r"layers\.1\.lsh\.family: must be one of"),
        (dict(good, layers=[dict(size=8), dict(size=4, activation="softmax", sampling="lsh", min_active=9,
                                               max_active=3)]), r"layers\.1\.lsh\.min_active"),
        (dict(good, layers=[dict(size=8), dict(size=4, activation="softmax", sampling="lsh", K=0)]),
         r"layers\.1\.lsh\.K"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            Network(bad)


def test_spec_without_any_one_key_is_an_error_naming_it():
    full = complete(spec(sampling="lsh"))
    CoreNetwork(full)
    for key in full:
        with pytest.raises(ValueError, match="missing required key '%s'" % key):
            CoreNetwork({k: v for k, v in full.items() if k != key})
    for key in full["layers"][1]:
        layers = [full["layers"][0], {k: v for k, v in full["layers"][1].items() if k != key}]
        if key == "precision":  # the one optional key: fp32 when absent
            assert CoreNetwork(dict(full, layers=layers)).spec["layers"][1]["precision"] == "fp32"
            continue
        if key == "negative_weight":  # optional too (read by sigmoid lsh layers): default 1
            assert CoreNetwork(dict(full, layers=layers)).spec["layers"][1][key] == 1.0
            continue
        with pytest.raises(ValueError, match=r"layers\.1\.(lsh\.)?%s: missing required key" % key):
            CoreNetwork(dict(full, layers=layers))


def test_spec_reports_back_what_it_was_given():
    full = complete(spec(sampling="lsh", lr=0.25, dropout=0.125, out=dict(range_pow=5, min_active=7)))
    got = CoreNetwork(full).spec
    assert got["lr"] == 0.25 and got["dropout"] == 0.125
    assert got["layers"][1]["min_active"] == 7 and got["layers"][1]["range_pow"] == 5
    for k, v in full.items():
        if k != "layers":
            assert got[k] == pytest.approx(v), k
    for given, back in zip(full["layers"], got["layers"]):
        assert back == given


def test_bad_batches_raise_value_error_before_training():
    x, lab, _ = PROBLEM
    net = Network(spec())
    rows = np.arange(4, dtype=np.int64)
    ptr, ind, val = x
    yptr, yind = lab
    bad_ind = ind.copy()
    bad_ind[ptr[2]] = 400
    bad_y = yind.copy()
    bad_y[3] = 16
    cases = [
        ((ptr.astype(np.int32), ind, val, yptr, yind, rows), r"x_indptr: expected dtype int64, got int32"),
        ((ptr, ind.astype(np.int64), val, yptr, yind, rows), r"x_indices: expected dtype int32"),
        ((ptr, ind, val.astype(np.float64), yptr, yind, rows), r"x_values: expected dtype float32"),
        ((ptr, ind, val, yptr, yind, [0, 1]), r"rows: expected a numpy array"),
        ((ptr, ind, val[:-1], yptr, yind, rows), r"x_values: has"),
        ((ptr, bad_ind, val, yptr, yind, rows), r"feature id 400 in sample 2 is out of range for input_dim=400"),
        ((ptr, ind, val, yptr, bad_y, rows), r"label id 16 in sample 3 is out of range for output size=16"),
        ((ptr, ind, val, yptr, yind, np.array([0, 5000], np.int64)), r"rows\[1\] = 5000 is out of range"),
        ((ptr, ind, val, yptr[:-1], yind, rows), r"y_indptr describes"),
        ((ptr[::-1].copy(), ind, val, yptr, yind, rows), r"x_indptr is not a valid CSR"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            net.train_batch(*args, 1e-2)
    nan_val = val.copy()
    nan_val[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        net.train_batch(ptr, ind, nan_val, yptr, yind, rows, 1e-2)
    with pytest.raises(ValueError, match="lr"):
        net.train_batch(*x, *lab, rows, -1e-3)
    with pytest.raises(ValueError, match="lr"):
        net.train_batch(*x, *lab, rows, float("nan"))
    with pytest.raises(ValueError, match=r"k: must be in \[1, 16\]"):
        net.predict_topk(*x, 17)
    with pytest.raises(ValueError, match="mode"):
        net.predict_topk(*x, 1, mode="fast")
    with pytest.raises(ValueError, match="step"):
        net.step = -1
    assert net.step == 0 and np.all(np.isfinite(net.parameters()["layers.0.weight"]))
    # A schedule may decay the rate to zero: allowed, and the weights stay put.
    w = net.parameters()["layers.0.weight"].copy()
    net.train_batch(*x, *lab, rows, 0.0)
    assert net.step == 1 and np.array_equal(w, net.parameters()["layers.0.weight"])


def test_ctrl_c_interrupts_training_without_corrupting_the_network():
    x, lab, _ = make_problem(n=2000, seed=2)
    net = Network(dict(input_dim=400, layers=[dict(size=64), dict(size=30000, activation="softmax")], threads=2))
    rows = np.arange(2000, dtype=np.int64)
    done = 0
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        t0 = time.time()
        while time.time() - t0 < 20:
            net.train_batch(*x, *lab, rows, 1e-3)
            done += 1
    elapsed = time.time() - t0
    timer.join()
    assert elapsed < 0.3 + 1.5
    assert net.step == done
    p = net.parameters()
    assert all(np.all(np.isfinite(v)) for v in p.values())
    # The partial batch was discarded: the next batch trains normally.
    loss = net.train_batch(*x, *lab, rows[:64], 1e-3)
    assert np.isfinite(loss) and net.step == done + 1


def test_generic_kernels_agree_with_the_vector_kernels(tmp_path):
    """SLIDE_ISA=generic selects the portable kernels: same model up to float rounding."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_engine import PROBLEM, Network, spec, train\n"
        "x, lab, _ = PROBLEM\n"
        "net = Network(spec(C=5000))\n"
        "losses = train(net, x, lab, epochs=1)\n"
        "top, sc = net.predict_topk(*x, 3)\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, losses=losses, top=top, sc=sc, isa=net.kernel_isa)\n")
    env = dict(os.environ, SLIDE_ISA="generic")
    subprocess.run([sys.executable, str(script)], check=True, env=env, timeout=120)
    generic = np.load(tmp_path / "out.npz")
    assert str(generic["isa"]) == "generic"
    x, lab, _ = PROBLEM
    net = Network(spec(C=5000))
    losses = train(net, x, lab, epochs=1)
    top, sc = net.predict_topk(*x, 3)
    np.testing.assert_allclose(generic["losses"], losses, rtol=1e-3)
    assert (generic["top"][:, 0] == top[:, 0]).mean() > 0.99
    np.testing.assert_allclose(generic["sc"], sc, rtol=1e-2, atol=1e-4)


# ---------------------------------------------------------------------- batched dense layers

def available_isas():
    from slide import _core
    f = _core.cpu_features()
    return ["generic"] + (["avx2"] if f["avx2"] and f["fma"] else []) + (["avx512"] if f["avx512f"] else [])


@pytest.mark.parametrize("isa", available_isas())
def test_matrix_product_kernels_match_numpy(isa):
    """The kernels behind the batched dense layers, on every instruction set this CPU runs, for
    shapes that exercise each tile size and every remainder (rows, columns, k not a multiple of
    the vector width, and empty dimensions)."""
    from slide import _core
    rng = np.random.default_rng(1)
    shapes = [(1, 1, 1), (3, 5, 7), (4, 64, 16), (5, 67, 33), (17, 130, 100), (128, 983, 512), (9, 16, 65),
              (0, 3, 4), (4, 0, 3), (3, 4, 0)]
    for m, n, k in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        tol = 1e-5 * (np.sqrt(k) + 1)
        got = {
            "a @ b": _core._matmul(a, b, isa=isa),
            "a.T view": _core._matmul(np.ascontiguousarray(a.T), b, transpose_a=True, isa=isa),
            "b.T view": _core._matmul(a, np.ascontiguousarray(b.T), transpose_b=True, isa=isa),
        }
        for name, c in got.items():
            assert c.shape == (m, n), (name, m, n, k)
            np.testing.assert_allclose(c, ref, rtol=0, atol=tol, err_msg=f"{name} {m}x{n}x{k}")
    with pytest.raises(ValueError, match="inner dimensions"):
        _core._matmul(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32), isa=isa)


def numpy_step(p, X, labels, lr, eps, hidden_layers, loss="softmax"):
    """One training step of a dense network in float64 numpy: forward, softmax cross-entropy with
    target mass 1/|y| (or, loss="sigmoid", per-label binary cross-entropy with target 1 on each
    label; unlabeled samples contribute nothing either way), backward, Adam at t = 1."""
    b = len(X)
    hs = [X]
    for l in range(hidden_layers + 1):
        W, bias = p[f"layers.{l}.weight"], p[f"layers.{l}.bias"]
        z = hs[-1] @ (W if l == 0 else W.T) + bias
        hs.append(np.maximum(z, 0) if l < hidden_layers else z)
    z = hs[-1]
    if loss == "sigmoid":
        prob = 1.0 / (1.0 + np.exp(-z))
    else:
        prob = np.exp(z - z.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
    target = np.zeros_like(prob)
    for i, ys in enumerate(labels):
        if ys:
            target[i, ys] = 1.0 if loss == "sigmoid" else 1.0 / len(ys)
    has = np.array([bool(ys) for ys in labels])
    d = (prob - target) * has[:, None] / b
    grads = {}
    for l in range(hidden_layers, -1, -1):
        h = hs[l]
        grads[f"layers.{l}.weight"] = h.T @ d if l == 0 else d.T @ h
        grads[f"layers.{l}.bias"] = d.sum(0)
        if l:
            W = p[f"layers.{l}.weight"]
            d = (d @ W) * (hs[l] > 0)
    new = {}
    c2 = 1 - 0.999
    for name, g in grads.items():
        m, v = 0.1 * g, c2 * g * g
        lr_t, eps_t = lr * np.sqrt(c2) / 0.1, eps * np.sqrt(c2)
        new[name] = p[name] - lr_t * m / (np.sqrt(v) + eps_t)
    return new


@pytest.mark.parametrize("hidden,loss", [([24], "softmax"), ([24, 12], "softmax"), ([24], "sigmoid"),
                                         ([24, 12], "sigmoid"), ([], "sigmoid"), ([], "softmax")])
def test_one_dense_step_matches_a_numpy_reference(hidden, loss):
    """A network without hash-sampled layers trains a batch layer by layer (matrix products;
    with no hidden layer, per sample): one step from the same weights equals a float64 numpy
    reference, for both output losses. A large Adam eps makes the first step proportional to
    the gradient, so gradient magnitudes are checked, not only signs."""
    x, lab, _ = make_problem(n=40, D=60, C=10, multilabel=True, seed=5)
    yptr, yind = lab
    # Sample 3 has no labels: it must contribute no gradient.
    yind = np.concatenate([yind[:yptr[3]], yind[yptr[4]:]]).astype(np.int32)
    yptr = np.concatenate([yptr[:4], yptr[4:] - (yptr[4] - yptr[3])]).astype(np.int64)
    layers = [dict(size=h, activation="relu") for h in hidden] + [dict(size=10, activation=loss)]
    eps, lr = 1.0, 0.05
    net = Network(dict(input_dim=60, layers=layers, threads=2, seed=1, eps=eps))
    start = {k: v.astype(np.float64) for k, v in net.parameters().items() if "adam" not in k}
    rows = np.arange(1, 30, dtype=np.int64)  # 29 samples: not a multiple of any tile size
    net.train_batch(*x, yptr, yind, rows, lr)
    ptr, ind, val = x
    X = np.zeros((len(rows), 60))
    labels = []
    for i, r in enumerate(rows):
        X[i, ind[ptr[r]:ptr[r + 1]]] = val[ptr[r]:ptr[r + 1]]
        labels.append(sorted(set(yind[yptr[r]:yptr[r + 1]].tolist())))
    assert labels[2] == []
    expected = numpy_step(start, X, labels, lr, eps, len(hidden), loss)
    got = net.parameters()
    for name, want in expected.items():
        moved = np.abs(want - start[name]).max()
        assert moved > 1e-4, name
        np.testing.assert_allclose(got[name], want, rtol=0, atol=2e-3 * moved, err_msg=name)
