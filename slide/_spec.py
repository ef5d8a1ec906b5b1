"""How a :class:`slide.Network` turns its arguments into configuration and engine settings:
the keyword shortcuts of ``Network(**overrides)`` and the engine's spec dict."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .config import WTA_BIN_SIZE, Config, ConfigError

# Shortcuts accepted by Network(**overrides): name -> dotted config key.
_SHORTCUTS = {
    "epochs": "training.epochs",
    "batch_size": "training.batch_size",
    "threads": "training.threads",
    "seed": "training.seed",
    "dropout": "training.dropout",
    "patience": "training.patience",
    "restore_best": "training.restore_best",
    "monitor": "training.monitor",
    "eval_every": "training.eval_every",
    "eval_samples": "training.eval_samples",
    "test_every": "training.test_every",
    "lr": "optimizer.lr",
    "weight_decay": "optimizer.weight_decay",
    "warmup_steps": "optimizer.warmup_steps",
    "lr_decay": "optimizer.lr_decay",
    "lr_plateau": "optimizer.lr_plateau",
    "lr_decay_min_steps": "optimizer.lr_decay_min_steps",
    "max_epochs": "training.max_epochs",
    "time_budget": "training.time_budget",
    "refit": "training.refit",
    "ensemble": "training.ensemble",
    "normalize": "data.normalize",
    "standardize": "data.standardize",
    "valid_fraction": "data.valid_fraction",
    "k": "eval.k",
}
_SPECIAL = ("hidden", "sampling", "precision")


def _engine_spec(cfg: Config, num_features: int) -> Dict[str, Any]:
    """Every value the engine takes, from the resolved config: the engine has no defaults and
    requires each key (range_pow 0 is derived by the engine, once; Network.spec reports it)."""
    layers = []
    for layer in cfg.layers:
        lsh = layer.lsh
        layers.append({
            "size": int(layer.size), "activation": layer.activation, "sampling": layer.sampling,
            "family": lsh.family, "K": lsh.K, "L": lsh.L, "range_pow": lsh.range_pow,
            "bucket_capacity": lsh.bucket_capacity, "bucket_policy": lsh.bucket_policy, "bin_size": WTA_BIN_SIZE,
            "selection": lsh.selection, "threshold": lsh.threshold,
            "min_active": lsh.min_active, "max_active": lsh.max_active, "precision": layer.precision,
            "negative_weight": float(lsh.negative_weight),
        })
    o, t = cfg.optimizer, cfg.training
    return {
        "input_dim": int(num_features), "layers": layers,
        "lr": o.lr, "beta1": o.betas[0], "beta2": o.betas[1], "eps": o.eps,
        "weight_decay": o.weight_decay, "dropout": t.dropout, "threads": t.threads,
        "seed": t.seed, "rebuild_first": t.rebuild_first, "rebuild_decay": t.rebuild_decay,
        "hugepages": t.hugepages, "recompute": t.recompute,
    }


def _apply_overrides(cfg: Config, overrides: Dict[str, Any]) -> Config:
    d = cfg.to_dict()
    for name, value in overrides.items():
        if name in _SHORTCUTS:
            section, key = _SHORTCUTS[name].split(".")
            d[section][key] = list(value) if name == "k" and not isinstance(value, int) else value
            if name == "k" and isinstance(value, int):
                d[section][key] = [value]
        elif name == "hidden":
            sizes = [value] if isinstance(value, (int, np.integer)) else list(value)
            hidden = []
            for i, s in enumerate(sizes):
                if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
                    raise ConfigError(f"Network(hidden=...): item {i} must be a positive integer, got {s!r}")
                hidden.append({"size": int(s), "activation": "relu", "sampling": "dense",
                               "lsh": d["layers"][0]["lsh"] if d["layers"] else {}})
            d["layers"] = hidden + [d["layers"][-1]]
        elif name == "sampling":
            d["layers"][-1]["sampling"] = value
        elif name == "precision":
            pass  # after the other overrides, which may replace the layers (hidden=...)
        else:
            import difflib

            options = list(_SHORTCUTS) + list(_SPECIAL)
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise TypeError(f"Network() got an unexpected keyword argument '{name}'{hint}; "
                            f"accepted shortcuts: {', '.join(options)}, or pass a config")
    if "precision" in overrides:
        # The first and the output layer: the layers that may store bf16.
        for i, layer in enumerate(d["layers"]):
            if i == 0 or i == len(d["layers"]) - 1:
                layer["precision"] = overrides["precision"]
    return Config.from_dict(d, source="Network(...)")
