"""precision: bf16 (weights and Adam moments in bfloat16, float32 arithmetic).

Figures behind the bands (benchmarks/bf16.py, README): on Delicious bf16 reaches the P@1 of
float32 within 0.005, with half the model state.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import slide
from slide import _bf16
from slide.config import Config, ConfigError

# Small hash-sampled network: the output layer's dot products, input gradients and Adam rows
# all run through the bf16 kernels.
LSH = dict(hidden=64, sampling="lsh", threads=1, seed=0, epochs=2, dropout=0.0, lr=1e-2)


def lsh_config(**layer_lsh):
    cfg = Config()
    cfg.layers[-1].lsh.family = "simhash"
    cfg.layers[-1].lsh.K = 4
    cfg.layers[-1].lsh.L = 8
    cfg.layers[-1].lsh.min_active = 40
    cfg.layers[-1].lsh.max_active = 80
    return cfg


@pytest.fixture(scope="module")
def small():
    return slide.datasets.make_synthetic("small", num_train=1500, num_test=500, num_labels=400)


def state_bytes(net):
    r = net.memory_report()
    return r["weights"] + r["optimizer"]


def test_precision_setting_defaults_and_errors():
    assert Config().layers[0].precision == "fp32" and Config().layers[-1].precision == "fp32"
    cfg = Config.from_dict({"layers": [{"size": 32, "precision": "bf16"}, {"size": 16}, {"activation": "auto", "precision": "bf16"}]})
    assert [l.precision for l in cfg.layers] == ["bf16", "fp32", "bf16"]
    with pytest.raises(ConfigError, match=r"layers\.1\.precision"):
        Config.from_dict({"layers": [{"size": 32}, {"size": 16, "precision": "bf16"}, {"activation": "auto"}]})
    with pytest.raises(ConfigError, match=r"layers\.0\.precision"):
        Config.from_dict({"layers": [{"size": 32, "precision": "fp16"}, {"activation": "auto"}]})
    # the keyword sets the layers that may store bf16: the first and the output layer
    net = slide.Network(hidden=[32, 16], precision="bf16")
    assert [l.precision for l in net.config.layers] == ["bf16", "fp32", "bf16"]
    assert "precision: fp32" in slide.config.defaults_yaml()


def test_bf16_arrays_state_bytes_and_kernels(small):
    train, test = small
    nets = {}
    for prec in ("fp32", "bf16"):
        nets[prec] = slide.Network(lsh_config(), precision=prec, **LSH)
        nets[prec].fit(train)
    p16, p32 = nets["bf16"].parameters(), nets["fp32"].parameters()
    for name in ("layers.0.weight", "layers.1.weight", "layers.1.weight.adam_m", "layers.1.weight.adam_v"):
        assert p16[name].dtype == np.uint16 and p32[name].dtype == np.float32
        assert p16[name].shape == p32[name].shape
    assert p16["layers.1.bias"].dtype == np.float32  # biases stay float32
    ratio = state_bytes(nets["bf16"]) / state_bytes(nets["fp32"])
    assert ratio <= 0.6, ratio
    assert nets["bf16"]._core.bf16_isa == slide._core.cpu_features()["bf16_kernels"]
    # both learn the same problem
    p1 = {k: n.evaluate(test, k=1)["P@1"] for k, n in nets.items()}
    assert p1["fp32"] > 0.3 and abs(p1["bf16"] - p1["fp32"]) <= 0.03, p1
    # exact and hash-sampled prediction both run on bf16 weights
    lab, sc = nets["bf16"].predict(test, k=3, mode="lsh")
    assert lab.shape == (len(test), 3) and np.all(np.isfinite(sc))


def test_bf16_save_load_round_trip(small, tmp_path):
    train, test = small
    net = slide.Network(lsh_config(), precision="bf16", **LSH)
    net.fit(train)
    path = tmp_path / "bf16.slide"
    net.save(path)
    back = slide.Network.load(path)
    assert [l.precision for l in back.config.layers] == ["bf16", "bf16"]
    pa, pb = net.parameters(), back.parameters()
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert pa[k].dtype == pb[k].dtype
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    assert state_bytes(back) == state_bytes(net)
    for mode in ("exact", "lsh"):
        a, b = net.predict(test, k=5, mode=mode), back.predict(test, k=5, mode=mode)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    # training resumes from the checkpoint as it would have gone on (one thread: bit-identical)
    net.fit(train, epochs=3)
    back.fit(train, epochs=3)
    for k in pa:
        np.testing.assert_array_equal(net.parameters()[k], back.parameters()[k], err_msg=k)


def test_bf16_values_into_a_float32_network_are_refused(small, tmp_path):
    train, _ = small
    net16 = slide.Network(lsh_config(), precision="bf16", **LSH)
    net16.fit(train, epochs=1)
    net32 = slide.Network(lsh_config(), **LSH)
    net32.fit(train, epochs=1)
    with pytest.raises(ValueError, match=r"layers\.1\.weight.*bfloat16.*float32"):
        net32._set_parameters({"layers.1.weight": net16.parameters()["layers.1.weight"]})
    # float values into a bf16 layer are rounded as the engine rounds
    w = net32.parameters()["layers.1.weight"].copy()
    net16._set_parameters({"layers.1.weight": w})
    np.testing.assert_array_equal(net16.parameters()["layers.1.weight"], _bf16.from_float32(w))
    np.testing.assert_allclose(_bf16.to_float32(net16.parameters()["layers.1.weight"]), w, rtol=2 ** -8, atol=0)


def test_python_rounding_matches_the_engine():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2 ** 32, size=100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[:4] = [0.0, -0.0, np.inf, -np.inf]
    net = slide.Network(precision="bf16", hidden=8, num_features=10, num_labels=4, threads=1)
    out = _bf16.from_float32(x)
    # the engine's stores: set float values, the engine rounds on its own only in training;
    # compare the Python rule against the round trip of exactly representable values
    exact = _bf16.to_float32(out)
    np.testing.assert_array_equal(_bf16.from_float32(exact[np.isfinite(exact)]), out[np.isfinite(exact)])
    finite = np.isfinite(x) & (np.abs(x) > 1e-37) & (np.abs(x) < 1e37)
    assert np.all(np.abs(exact[finite] - x[finite]) <= np.abs(x[finite]) * 2.0 ** -8)
    assert net.parameters()["layers.0.weight"].dtype == np.uint16


@pytest.mark.skipif(not slide._core.cpu_features()["avx512bf16"], reason="the CPU has no AVX512_BF16")
def test_avx512_bf16_kernels_agree_with_the_fallback(small, tmp_path):
    """SLIDE_ISA=avx512f runs bf16 layers on the exact fallback: the same training up to the
    order of float32 additions (and an occasional one-unit difference in a rounded store)."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, numpy as np, slide\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_bf16 import LSH, lsh_config\n"
        "train, test = slide.datasets.make_synthetic('small', num_train=1500, num_test=500, num_labels=400)\n"
        "net = slide.Network(lsh_config(), precision='bf16', **LSH)\n"
        "h = net.fit(train, epochs=1)\n"
        "lab, sc = net.predict(test, k=1)\n"
        "p = {k: v for k, v in net.parameters().items()}\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, lab=lab, sc=sc, isa=net._core.bf16_isa, **p)\n")
    env = dict(os.environ, SLIDE_ISA="avx512f")
    subprocess.run([sys.executable, str(script)], check=True, env=env, timeout=300)
    fallback = np.load(tmp_path / "out.npz")
    assert str(fallback["isa"]) in ("avx2", "generic")
    train, test = small
    net = slide.Network(lsh_config(), precision="bf16", **LSH)
    net.fit(train, epochs=1)
    assert net._core.bf16_isa == "avx512_bf16"
    lab, sc = net.predict(test, k=1)
    assert (fallback["lab"][:, 0] == lab[:, 0]).mean() > 0.95
    np.testing.assert_allclose(fallback["sc"], sc, rtol=0.05, atol=1e-3)
    for k, v in net.parameters().items():
        a = _bf16.to_float32(v) if _bf16.is_bf16(v) else v
        b = _bf16.to_float32(fallback[k]) if _bf16.is_bf16(fallback[k]) else fallback[k]
        scale = np.abs(a).max() + 1e-12
        assert np.abs(a - b).max() <= 0.05 * scale, k
        if _bf16.is_bf16(v):
            assert np.mean(a != b) < 0.5, k  # most bf16 values are stored identically


def test_bf16_learns_delicious_within_a_band_of_fp32(delicious):
    train, test = delicious
    p1 = {}
    for prec in ("fp32", "bf16"):
        net = slide.Network(precision=prec, threads=1, epochs=2, seed=0)
        net.fit(train)
        p1[prec] = net.evaluate(test, k=1)["P@1"]
    assert p1["fp32"] > 0.6 and abs(p1["bf16"] - p1["fp32"]) <= 0.01, p1


def test_memory_estimate_counts_bf16_storage():
    cfg = Config.from_yaml(os.path.join(os.path.dirname(__file__), "..", "datasets", "synth-amazon-670k.yaml"))
    fp32 = slide.memory.estimate(cfg, 135_909, 670_091)
    for layer in cfg.layers:
        layer.precision = "bf16"
    bf16 = slide.memory.estimate(cfg, 135_909, 670_091)
    ratio = (bf16["weights"] + bf16["adam"]) / (fp32["weights"] + fp32["adam"])
    assert 0.5 <= ratio <= 0.51, ratio
    net = slide.Network(cfg, num_features=2_000, num_labels=5_000, threads=1)
    rep = net.memory_report()
    est = slide.memory.estimate(cfg, 2_000, 5_000)
    assert rep["weights"] == est["weights"] and rep["optimizer"] == est["adam"]


# ------------------------------------------------- bf16 with the engine settings of wide output layers
#
# Spread table rebuilds hash the bf16 rows widened exactly, and the shared in-batch negatives
# block reads the bf16 rows and updates them with the bf16 Adam step (the stochastic rounding
# keyed by step, layer and row of the per-sample path).

from test_engine import Network as CoreNetwork  # noqa: E402
from test_engine import make_problem, params_copy, spec
from test_engine import train as core_train

WIDE = make_problem(n=3000, D=2400, C=300, seed=4)


def wide_spec(out="bf16", first="fp32", threads=1, **extra):
    # as tests/test_profile.py: more than twice as wide as the widest active set, so the
    # output layer takes the batch's labels as negatives and may score them as a block
    o = dict(size=300, activation="softmax", sampling="lsh", family="dwta", K=2, L=8, min_active=24,
             max_active=96, bucket_capacity=32, precision=out)
    s = spec(D=2400, C=300, hidden=48, threads=threads, out=o, **extra)
    s["layers"][0]["precision"] = first
    return s


def test_bf16_spread_rebuild_gives_the_at_once_tables():
    # lr = 0: the bf16 rows do not move, so a rebuild spread over 4 batches ends with exactly
    # the tables of the at-once rebuild (and of the build from the same rows widened to float32).
    x, lab, _ = WIDE
    once, spread = CoreNetwork(wide_spec(rebuild_first=6)), CoreNetwork(wide_spec(rebuild_first=6))
    once.rebuild_spread, spread.rebuild_spread = 1, 4
    rows = np.arange(len(x[0]) - 1, dtype=np.int64)
    pending = []
    for step in range(1, 11):
        r = rows[(step - 1) * 64:step * 64]
        once.train_batch(*x, *lab, r, 0.0)
        spread.train_batch(*x, *lab, r, 0.0)
        pending.append(spread.rebuild_pending)
    assert pending == [False] * 5 + [True] * 3 + [False] * 2
    assert spread.parameters()["layers.1.weight"].dtype == np.uint16
    a, b = once.table_state(1), spread.table_state(1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # the same tables from a float32 layer holding the widened rows
    wide = CoreNetwork(wide_spec(out="fp32", rebuild_first=6))
    wide.parameters()["layers.1.weight"][:] = _bf16.to_float32(spread.parameters()["layers.1.weight"])
    wide.rebuild_spread = 4
    seen = []
    for step in range(1, 11):
        wide.train_batch(*x, *lab, rows[(step - 1) * 64:step * 64], 0.0)
        seen.append(wide.rebuild_pending)
    assert seen == pending
    c = wide.table_state(1)
    assert all(np.array_equal(a[k], c[k]) for k in a)


def test_bf16_shared_block_step_matches_fp32_to_bf16_precision():
    # One shared-negatives batch from the same (bf16-representable) weights and tables: the
    # bf16 layer touches the same rows as float32 and lands within bf16 rounding of its step.
    x, lab, _ = WIDE
    a, b = CoreNetwork(wide_spec()), CoreNetwork(wide_spec(out="fp32"))
    pb = b.parameters()
    pb["layers.1.weight"][:] = _bf16.to_float32(a.parameters()["layers.1.weight"])
    b.rebuild_tables()
    ta, tb = a.table_state(1), b.table_state(1)
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)
    for net in (a, b):
        net.shared_negatives = True
        assert net.uses_shared_negatives
    rows = np.arange(64, dtype=np.int64)
    la, lb = a.train_batch(*x, *lab, rows, 1e-2), b.train_batch(*x, *lab, rows, 1e-2)
    assert abs(la - lb) < 1e-3 * abs(lb)
    pa, pb = a.parameters(), b.parameters()
    touched_a = np.any(_bf16.to_float32(pa["layers.1.weight.adam_m"]) != 0, axis=1)
    touched_b = np.any(pb["layers.1.weight.adam_m"] != 0, axis=1)
    assert touched_b.sum() > 0 and np.array_equal(touched_a, touched_b)
    for name in ("layers.1.weight", "layers.1.weight.adam_m", "layers.1.weight.adam_v"):
        wa, wb = _bf16.to_float32(pa[name]), pb[name]
        rel = np.abs(wa - wb) / (np.abs(wb) + 1e-3 * np.abs(wb).max())
        assert np.quantile(rel, 0.999) < 2 ** -6, (name, np.quantile(rel, 0.999))
    np.testing.assert_allclose(pa["layers.1.bias"], pb["layers.1.bias"], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("spread", [1, 3])
def test_bf16_shared_negatives_learn_like_fp32(spread):
    x, lab, y = WIDE
    scores = {}
    for prec in ("fp32", "bf16"):
        net = CoreNetwork(wide_spec(out=prec, first=prec, threads=2, rebuild_first=6))
        net.set_label_frequencies(np.bincount(lab[1], minlength=300).astype(np.float32) / (len(x[0]) - 1))
        net.shared_negatives = True
        net.rebuild_spread = spread
        losses = core_train(net, x, lab, epochs=4)
        assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3])
        top, _ = net.predict_topk(*x, 1)
        scores[prec] = float((top[:, 0] == y).mean())
    assert scores["fp32"] > 0.8 and abs(scores["bf16"] - scores["fp32"]) < 0.03, scores


def test_bf16_shared_negatives_are_deterministic_for_any_thread_count():
    x, lab, _ = WIDE
    runs = []
    for threads in (1, 2):
        net = CoreNetwork(wide_spec(first="bf16", threads=threads, rebuild_first=6))
        net.shared_negatives = True
        net.rebuild_spread = 3
        core_train(net, x, lab, epochs=1)
        runs.append(params_copy(net))
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])


class _Watch(slide.callbacks.Callback):
    """Spreads rebuilds over `spread` batches and records what the engine did."""

    def __init__(self, spread):
        self.spread, self.pending, self.shared = spread, 0, None

    def on_train_begin(self, net):
        net._core.rebuild_spread = self.spread
        self.shared = net._core.uses_shared_negatives

    def on_batch_end(self, net, step, loss):
        self.pending += bool(net._core.rebuild_pending)


def test_bf16_amazon_shaped_output_learns_within_a_band_of_fp32():
    # 70,000 labels: over the 65,536 of shared_negatives="auto"; rebuilds spread over 4 batches.
    train, test = slide.datasets.make_synthetic("small", num_train=4000, num_test=1000, num_labels=70_000,
                                                num_features=2000, avg_labels=2.0, power_law_exponent=1.0, seed=0)
    top = np.asarray(train.labels.sum(0)).ravel().argmax()
    baseline = float(np.asarray(test.labels[:, top].todense()).mean())  # the most frequent label
    p1 = {}
    for prec in ("fp32", "bf16"):
        net = slide.Network(hidden=64, precision=prec, threads=2, epochs=3, seed=0, lr=2e-2)
        watch = _Watch(4)
        net.fit(train, callbacks=[watch])
        assert watch.shared is True and watch.pending > 0
        p1[prec] = net.evaluate(test, k=1)["P@1"]
    assert p1["fp32"] > 2 * baseline and abs(p1["bf16"] - p1["fp32"]) <= 0.03, (p1, baseline)
