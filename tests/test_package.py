import subprocess
import sys

import pytest

import slide
from slide.config import Config, ConfigError, defaults_yaml


def test_core_reports_cpu_features():
    f = slide._core.cpu_features()
    assert f["kernels"] in ("generic", "avx2", "avx512")
    assert slide._core.default_threads() >= 1


def test_defaults_round_trip_through_yaml(tmp_path):
    text = defaults_yaml()
    p = tmp_path / "c.yaml"
    p.write_text(text)
    assert Config.from_yaml(p).to_dict() == Config().to_dict()


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match=r"training\.batch_sise.*did you mean 'batch_size'"):
        Config.from_dict({"training": {"batch_sise": 3}})


@pytest.mark.parametrize("d, msg", [
    ({"training": {"batch_size": "big"}}, r"training\.batch_size: expected an integer"),
    ({"training": {"batch_size": 0}}, r"training\.batch_size: must be >= 1"),
    ({"optimizer": {"lr": -1}}, r"optimizer\.lr: must be > 0"),
    ({"layers": [{"size": 8, "activation": "softmax"}, {"activation": "softmax"}]}, r"layers\.0\.activation"),
    ({"layers": [{"activation": "softmax", "sampling": "lsh", "lsh": {"family": "dwat"}}]},
     r"layers\.0\.lsh\.family.*did you mean 'dwta'"),
])
def test_invalid_values_name_the_key(d, msg):
    with pytest.raises(ConfigError, match=msg):
        Config.from_dict(d)


def test_overrides_address_nested_keys_and_list_items():
    c = Config().with_overrides(["training.epochs=3", "layers.1.sampling=lsh", "layers.1.lsh.K=4"])
    assert c.training.epochs == 3 and c.layers[1].sampling == "lsh" and c.layers[1].lsh.K == 4
    with pytest.raises(ConfigError, match="unknown key 'training.epoch'"):
        Config().with_overrides(["training.epoch=3"])


def test_config_files_that_are_not_configs_raise_config_errors(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"\xff\xfe training: {}")
    with pytest.raises(ConfigError, match="latin1.yaml: not a UTF-8 text file"):
        Config.from_yaml(bad)
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000)
    with pytest.raises(ConfigError, match="deep.yaml: YAML nested too deeply"):
        Config.from_yaml(deep)
    with pytest.raises(ConfigError, match="list items are addressed by index"):
        Config().with_overrides(["layers.--0.size=3"])


@pytest.mark.parametrize("key, value", [("threads", 60000), ("seed", 2**64)])
def test_limits_that_would_kill_the_engine_are_refused(key, value):
    with pytest.raises(ConfigError, match=rf"training\.{key}: must be <="):
        Config.from_dict({"training": {key: value}})


def test_the_version_is_written_once():
    import importlib.metadata
    import re
    from pathlib import Path

    from conftest import ROOT

    pyproject = (ROOT / "pyproject.toml").read_text()
    # no static version in [project]: the build reads __version__ from slide/__init__.py
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', pyproject, re.M)
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert re.search(r'^__version__ = "[^"]+"$', (ROOT / "slide" / "__init__.py").read_text(), re.M)
    assert importlib.metadata.version("slide") == slide.__version__
