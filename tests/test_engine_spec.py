"""The engine receives exactly the resolved Python configuration: it has no defaults of its
own, requires every key, and reports back what it runs."""
import pytest

import slide
from slide import _core
from slide.config import WTA_BIN_SIZE
from slide.network import _engine_spec


def _resolved(cfg, num_features=300, num_labels=5000):
    net = slide.Network(cfg, num_features=num_features, num_labels=num_labels)
    return net, net.config


@pytest.mark.parametrize("sampling", ["dense", "lsh"])
def test_core_reports_the_resolved_config(sampling):
    cfg = slide.Config()
    cfg.layers[-1].sampling = sampling
    cfg.training.threads = 1
    cfg.training.hugepages = False
    net, rc = _resolved(cfg)
    got = net._core.spec
    o, t = rc.optimizer, rc.training
    assert got["lr"] == pytest.approx(o.lr) and got["dropout"] == pytest.approx(t.dropout)
    assert (got["beta1"], got["beta2"]) == pytest.approx(tuple(o.betas))
    assert got["eps"] == pytest.approx(o.eps) and got["weight_decay"] == pytest.approx(o.weight_decay)
    assert (got["threads"], got["seed"], got["rebuild_first"], got["hugepages"]) == \
        (t.threads, t.seed, t.rebuild_first, t.hugepages)
    assert got["rebuild_decay"] == pytest.approx(t.rebuild_decay)
    assert len(got["layers"]) == len(rc.layers)
    for layer, back in zip(rc.layers, got["layers"]):
        lsh = layer.lsh
        assert (back["size"], back["activation"], back["sampling"]) == (layer.size, layer.activation, layer.sampling)
        for key in ("family", "K", "L", "bucket_capacity", "bucket_policy", "selection", "threshold",
                    "min_active", "max_active"):
            assert back[key] == getattr(lsh, key), key
        assert back["bin_size"] == WTA_BIN_SIZE
        if layer.sampling == "lsh" and lsh.range_pow == 0:
            # derived once, by the engine: within the bits the codes carry
            assert 1 <= back["range_pow"] <= _core.lsh_code_bits(lsh.family, lsh.K, WTA_BIN_SIZE)
        else:
            assert back["range_pow"] == lsh.range_pow


def test_engine_spec_round_trips_through_the_core():
    cfg = slide.Config()
    cfg.layers[-1].sampling = "lsh"
    cfg.layers[-1].activation = "softmax"   # resolved as Network._build resolves auto for lsh
    cfg.layers[-1].size = 2000
    cfg.layers[-1].lsh.range_pow = 9
    cfg.training.threads = 1
    spec = _engine_spec(cfg, 300)
    back = _core.Network(spec).spec
    assert back["layers"] == spec["layers"]
    assert {k: v for k, v in back.items() if k != "layers"} == \
        pytest.approx({k: v for k, v in spec.items() if k != "layers"})


def test_range_pow_bound_is_the_engines():
    cfg = slide.Config()
    bits = _core.lsh_code_bits("dwta", cfg.layers[-1].lsh.K, WTA_BIN_SIZE)
    d = cfg.to_dict()
    d["layers"][-1]["lsh"]["range_pow"] = bits + 1
    with pytest.raises(slide.ConfigError, match=r"layers\.1\.lsh\.range_pow"):
        slide.Config.from_dict(d)
    d["layers"][-1]["lsh"]["range_pow"] = bits
    slide.Config.from_dict(d)
