"""The engine's phase profiler, the bandwidth triad, spread table rebuilds and shared negatives."""
import numpy as np
import pytest

from slide import _core
from test_engine import Network, make_problem, params_copy, spec, train

PHASES = {"hashing", "selection", "forward", "softmax", "backward", "adam", "rebuild", "shuffle"}

# A hash-sampled output layer more than twice as wide as its widest active set, so it takes
# the batch's labels as negatives (and may score them as a shared block).
WIDE = make_problem(n=3000, D=2400, C=300, seed=4)


def wide_spec(threads=1, activation="softmax", **extra):
    out = dict(size=300, activation=activation, sampling="lsh", family="dwta", K=2, L=8, min_active=24,
               max_active=96, bucket_capacity=32)
    return spec(D=2400, C=300, hidden=48, threads=threads, out=out, **extra)


def p_at_1(net, x, y):
    top, _ = net.predict_topk(*x, 1)
    return float((top[:, 0] == y).mean())


# ---------------------------------------------------------------------- profiler

def test_profiler_is_off_by_default_and_counts_nothing_then():
    x, lab, _ = WIDE
    net = Network(wide_spec())
    assert net.profiling is False
    train(net, x, lab, epochs=1)
    p = net.profile()
    assert p["enabled"] is False and p["batches"] == 0 and p["samples"] == 0
    assert set(p["phases"]) == PHASES
    assert all(v["seconds"] == 0 and v["bytes"] == 0 and v["calls"] == 0 for v in p["phases"].values())


def test_profiler_totals_are_consistent():
    x, lab, _ = WIDE
    net = Network(wide_spec(threads=2))
    net.profiling = True
    n = len(x[0]) - 1
    rows = np.arange(n, dtype=np.int64)
    batches = 0
    for s in range(0, 1280, 64):
        net.train_batch(*x, *lab, rows[s:s + 64], 1e-2)
        batches += 1
    net.add_profile_time("shuffle", 0.25, 1000.0)
    p = net.profile()
    assert p["batches"] == batches and p["samples"] == 64 * batches and p["threads"] == 2
    ph = p["phases"]
    for name in ("hashing", "selection", "forward", "softmax", "backward", "adam"):
        assert ph[name]["calls"] > 0 and ph[name]["seconds"] > 0 and ph[name]["bytes"] > 0, name
    assert ph["rebuild"]["calls"] == batches  # every batch checks the schedule
    assert ph["shuffle"] == {"seconds": 0.25, "thread_seconds": 0.0, "bytes": 1000.0, "calls": 1}
    inside = sum(v["seconds"] for k, v in ph.items() if k != "shuffle")
    # Per-sample phases count thread-seconds / threads: the phases fit in the batch time.
    assert 0 < inside <= p["batch_seconds"] * 1.05 + 1e-3
    assert p["batch_seconds"] / batches <= p["longest_batch"] <= p["batch_seconds"]
    assert 1 <= p["longest_batch_step"] <= batches
    net.reset_profile()
    q = net.profile()
    assert q["batches"] == 0 and q["longest_batch"] == 0 and q["enabled"] is True
    assert all(v["seconds"] == 0 and v["bytes"] == 0 for v in q["phases"].values())
    net.profiling = False
    net.train_batch(*x, *lab, rows[:64], 1e-2)
    assert net.profile()["batches"] == 0
    with pytest.raises(ValueError, match="phase"):
        net.add_profile_time("nonsense", 1.0)
    with pytest.raises(ValueError, match="profiling"):
        net.profiling = 1


@pytest.mark.parametrize("shared", [False, True])
def test_profiling_does_not_change_the_results(shared):
    x, lab, _ = WIDE
    nets = [Network(wide_spec()) for _ in range(2)]
    nets[1].profiling = True
    for net in nets:
        net.shared_negatives = shared
        train(net, x, lab, epochs=1)
    a, b = params_copy(nets[0]), params_copy(nets[1])
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_network_fit_records_the_shuffle():
    import slide
    x, lab, _ = make_problem(n=400)
    X = _to_scipy(x, 400)
    Y = _to_scipy((lab[0], lab[1], np.ones(len(lab[1]), np.float32)), 16)

    class On(slide.callbacks.Callback):
        def on_train_begin(self, net):
            net._core.profiling = True

    net = slide.Network({"layers": [{"size": 16}, {"size": None, "activation": "softmax"}], "training": {"epochs": 2, "threads": 1}})
    net.fit((X, Y), callbacks=[On()])
    p = net._core.profile()
    assert p["phases"]["shuffle"]["calls"] == 2 and p["batches"] > 0


def _to_scipy(csr, cols):
    import scipy.sparse as sp
    indptr, indices, values = csr
    return sp.csr_matrix((values, indices, indptr), shape=(len(indptr) - 1, cols))


def test_stream_triad_measures_a_positive_bandwidth():
    gbs = _core.stream_triad(16, 1, 2)
    assert 0.1 < gbs < 10000
    assert _core.stream_triad(8, 0, 1) > 0
    for bad in (dict(mib=0), dict(reps=0), dict(threads=-1)):
        with pytest.raises(ValueError):
            _core.stream_triad(**dict(dict(mib=8, threads=1, reps=1), **bad))


# ---------------------------------------------------------------------- spread rebuilds

def test_rebuild_spread_setting():
    net = Network(wide_spec(rebuild_first=20))
    assert net.rebuild_spread == 0
    assert net.rebuild_batches(1) == 1       # auto: a small layer rebuilds at once
    net.rebuild_spread = 5
    assert net.rebuild_batches(1) == 5
    net.rebuild_spread = 500
    assert net.rebuild_batches(1) == 20      # done before the next rebuild is due
    with pytest.raises(ValueError, match="rebuild_spread"):
        net.rebuild_spread = -1
    with pytest.raises(ValueError, match="LSH"):
        net.rebuild_batches(0)


def test_spread_rebuild_gives_the_at_once_tables_when_weights_stay():
    # lr = 0: the weights do not move while the rebuild is spread, so the tables it ends
    # with are exactly those an at-once rebuild at the scheduled step builds.
    x, lab, _ = WIDE
    once, spread = Network(wide_spec(rebuild_first=6)), Network(wide_spec(rebuild_first=6))
    once.rebuild_spread, spread.rebuild_spread = 1, 4
    rows = np.arange(len(x[0]) - 1, dtype=np.int64)
    pending = []
    for step in range(1, 11):
        r = rows[(step - 1) * 64:step * 64]
        once.train_batch(*x, *lab, r, 0.0)
        spread.train_batch(*x, *lab, r, 0.0)
        pending.append(spread.rebuild_pending)
        assert not once.rebuild_pending
    # rebuild due at step 6, spread over steps 6..9
    assert pending == [False] * 5 + [True] * 3 + [False] * 2
    a, b = once.table_state(1), spread.table_state(1)
    assert all(np.array_equal(a[k], b[k]) for k in a if k != "num_rows") and a["num_rows"] == b["num_rows"]


def test_spread_rebuild_is_deterministic_and_learns():
    x, lab, y = WIDE
    runs = []
    for threads in (1, 2):
        net = Network(wide_spec(threads=threads, rebuild_first=6))
        net.rebuild_spread = 3
        train(net, x, lab, epochs=3)
        runs.append(net)
    a, b = params_copy(runs[0]), params_copy(runs[1])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert p_at_1(runs[0], x, y) > 0.6


# ---------------------------------------------------------------------- shared negatives

def test_shared_negatives_setting():
    net = Network(wide_spec())
    assert net.shared_negatives == "auto"
    assert net.uses_shared_negatives is False     # auto: only from 65,536 output neurons
    net.shared_negatives = True
    assert net.shared_negatives is True and net.uses_shared_negatives is True
    net.shared_negatives = False
    assert net.uses_shared_negatives is False
    net.shared_negatives = "auto"
    with pytest.raises(ValueError, match="shared_negatives"):
        net.shared_negatives = "yes"
    dense = Network(spec())
    with pytest.raises(ValueError, match="shared_negatives=True needs"):
        dense.shared_negatives = True
    dense.shared_negatives = False


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_shared_negatives_on_and_off_both_learn(activation):
    x, lab, y = WIDE
    scores = {}
    for shared in (False, True):
        net = Network(wide_spec(threads=2, activation=activation))
        net.set_label_frequencies(np.bincount(lab[1], minlength=300).astype(np.float32) / (len(x[0]) - 1))
        net.shared_negatives = shared
        # the binary loss starts every label near 1/2 and needs more passes here
        losses = train(net, x, lab, epochs=4 if activation == "softmax" else 12)
        assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3])
        scores[shared] = p_at_1(net, x, y)
    assert scores[False] > 0.8 and scores[True] > 0.8
    assert abs(scores[True] - scores[False]) < 0.08


def test_shared_negatives_are_deterministic_for_any_thread_count():
    x, lab, _ = WIDE
    runs = []
    for threads in (1, 2):
        net = Network(wide_spec(threads=threads))
        net.shared_negatives = True
        train(net, x, lab, epochs=1)
        runs.append(params_copy(net))
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])


# ---------------------------------------------------------------------- config keys

def test_config_keys_reach_the_engine():
    import slide
    x, lab, _ = make_problem(n=400)
    X = _to_scipy(x, 400)
    Y = _to_scipy((lab[0], lab[1], np.ones(len(lab[1]), np.float32)), 16)
    layers = [{"size": 16}, {"size": None, "activation": "softmax", "sampling": "lsh",
                             "lsh": {"K": 2, "L": 4, "min_active": 4, "max_active": 6}}]
    net = slide.Network({"layers": layers, "training": {"epochs": 1, "threads": 1}})
    net.fit((X, Y))
    assert net._core.shared_negatives == "auto" and net._core.rebuild_spread == 0
    net = slide.Network({"layers": layers, "training": {"epochs": 1, "threads": 1, "shared_negatives": True,
                                                        "rebuild_spread": 3}})
    net.fit((X, Y))
    assert net._core.shared_negatives is True and net._core.rebuild_spread == 3
    assert net._core.rebuild_batches(1) == 3
    narrow = [layers[0], {**layers[1], "lsh": {"K": 2, "L": 4, "min_active": 4, "max_active": 8}}]
    net = slide.Network({"layers": narrow, "training": {"epochs": 1, "shared_negatives": True}})
    with pytest.raises(slide.ConfigError, match="training.shared_negatives: .*needs a hash-sampled output layer"):
        net.fit((X, Y))


@pytest.mark.parametrize("key, value, message", [
    ("shared_negatives", "yes", "training.shared_negatives: expected true, false or auto, got 'yes'"),
    ("shared_negatives", 1, "training.shared_negatives: expected true or false, got 1"),
    ("rebuild_spread", -1, "training.rebuild_spread: must be >= 0, got -1"),
])
def test_config_keys_reject_bad_values(key, value, message):
    import slide
    with pytest.raises(slide.ConfigError, match=message):
        slide.Config.from_dict({"training": {key: value}})
