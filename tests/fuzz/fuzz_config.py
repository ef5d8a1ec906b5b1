"""Fuzz the configuration schema: ``Config.from_yaml``, ``Config.from_dict`` and ``--set``.

Promise under test (slide/config.py): every invalid configuration raises ``ConfigError``
whose message names the file or key; nothing else escapes (no TypeError, KeyError,
UnicodeDecodeError, RecursionError, ...). A configuration that is accepted must survive
a round trip through ``to_dict`` and ``to_yaml`` unchanged.

The first input byte picks the mode:
  0: the rest is a YAML file given to ``Config.from_yaml``;
  1: the rest drives edits of the default tree (typed values at known and unknown keys)
     and the edited dict goes to ``Config.from_dict``;
  2: the rest is split into ``key=value`` assignments for ``Config.with_overrides``.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

import atheris  # noqa: E402

with atheris.instrument_imports(include=["slide.config", "yaml"]):
    import yaml
    from slide.config import Config, ConfigError

# Values of every shape a user might type, including the awkward ones.
_VALUES = [None, True, False, 0, 1, -1, 2, 7, 32, 33, 1024, 1025, 2**31, 2**63, -2**63, 0.0, 0.5, 1.0,
           -0.5, 1e-9, 1e308, float("inf"), float("-inf"), float("nan"), "", "relu", "softmax", "lsh",
           "dense", "auto", "adam", "dwta", "simhash", "wta", "fifo", "reservoir", "topk", "threshold",
           "xc", "libsvm", "l2", "1e-3", "nan", "inf", "0x10", "yes", "~", [], [1], [0.9, 0.999], [1, 3, 5],
           [0.9], [1.0, 0.5], [-1], [[1]], {}, {"size": 4}, {"size": None, "activation": "softmax"},
           [{"size": 8}, {"activation": "softmax"}], [{"activation": "softmax"}], [{}]]


def _paths(tree, prefix=()):
    """Every key path of a nested dict/list, containers included."""
    out = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.extend(_paths(v, prefix + (i,)))
    return out


def _set(tree, path, value):
    cur = tree
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value


def _value(fdp):
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind <= 2:
        # a copy: later edits of the tree must not change (or nest into) the shared examples,
        # which would carry state from one input to the next
        return copy.deepcopy(_VALUES[fdp.ConsumeIntInRange(0, len(_VALUES) - 1)])
    if kind == 3:
        return fdp.ConsumeInt(8)
    if kind == 4:
        return fdp.ConsumeFloat()
    return fdp.ConsumeUnicodeNoSurrogates(12)


def _check_round_trip(cfg: Config) -> None:
    again = Config.from_dict(cfg.to_dict())
    if again != cfg:
        raise _harness.Finding(f"to_dict round trip changed the config:\n{cfg}\n{again}")
    via_yaml = Config.from_dict(yaml.safe_load(cfg.to_yaml()))
    if via_yaml != cfg:
        raise _harness.Finding(f"to_yaml round trip changed the config:\n{cfg}\n{via_yaml}")


def _one(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 3, data[1:]
    if mode == 0:
        path = os.path.join(_harness.scratch_dir(), "config.yaml")
        with open(path, "wb") as fh:
            fh.write(rest)
        try:
            cfg = Config.from_yaml(path)
        except ConfigError as e:
            if path not in str(e):
                raise _harness.Finding(f"ConfigError does not name the file {path}: {e}") from e
            return
        # data paths were resolved against the file's folder; the rest must round-trip
        _check_round_trip(cfg)
    elif mode == 1:
        fdp = atheris.FuzzedDataProvider(rest)
        tree = Config().to_dict()
        for _ in range(fdp.ConsumeIntInRange(1, 6)):
            paths = [p for p in _paths(tree) if p]
            if fdp.ConsumeBool() or not paths:
                # a new key somewhere (unknown keys must be rejected by name)
                parents = [p for p in _paths(tree) if isinstance(_get(tree, p), dict)]
                parent = parents[fdp.ConsumeIntInRange(0, len(parents) - 1)]
                _set_new(tree, parent, fdp.ConsumeUnicodeNoSurrogates(10), _value(fdp))
            else:
                _set(tree, paths[fdp.ConsumeIntInRange(0, len(paths) - 1)], _value(fdp))
        try:
            cfg = Config.from_dict(tree)
        except ConfigError:
            return
        _check_round_trip(cfg)
    else:
        text = rest.decode("utf-8", "replace")
        assignments = [a for a in text.split("\n") if a]
        try:
            cfg = Config().with_overrides(assignments)
        except ConfigError:
            return
        _check_round_trip(cfg)


def _get(tree, path):
    cur = tree
    for p in path:
        cur = cur[p]
    return cur


def _set_new(tree, parent, key, value):
    _get(tree, parent)[key] = value


one_input = _harness.guard(_one, (ConfigError,))

if __name__ == "__main__":
    _harness.main(one_input)
