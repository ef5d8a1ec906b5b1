"""One configuration schema for the CLI, YAML files and :class:`slide.Network`.

A configuration is a tree of dataclasses. ``Config.from_dict`` / ``Config.from_yaml``
validate everything before any work starts: unknown keys (with a did-you-mean),
wrong types and impossible values raise :class:`ConfigError` naming the key.
``slide config --defaults`` prints :func:`defaults_yaml`, the full default tree
with a comment per key, generated from the ``doc`` metadata below.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Union, get_args, get_origin, get_type_hints

import yaml

__all__ = [
    "ConfigError",
    "DataConfig",
    "LshConfig",
    "LayerConfig",
    "OptimizerConfig",
    "TrainingConfig",
    "EvalConfig",
    "Config",
    "defaults_yaml",
]


class ConfigError(ValueError):
    """An invalid configuration: the message names the offending key (``training.batch_size``)."""


def monitor_k(monitor) -> Optional[int]:
    """k of a ``training.monitor`` value ``P@k``; None for anything else."""
    m = re.fullmatch(r"P@([1-9][0-9]*)", monitor) if isinstance(monitor, str) else None
    return int(m.group(1)) if m else None


def _f(default, doc, **kw):
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass
class DataConfig:
    train: Optional[str] = _f(None, "training file (XC text format or libsvm multilabel)")
    test: Optional[str] = _f(None, "test file, evaluated during and after training")
    valid: Optional[str] = _f(None, "validation file for early stopping; null = hold out valid_fraction of train")
    valid_fraction: float = _f(0.0, "fraction of train held out (seeded) for validation when `valid` is null; "
                                    "0 = none, except that training.epochs=auto holds out 20% (at most 5,000 points)")
    format: str = _f("auto", "file format: auto | xc | libsvm", choices=("auto", "xc", "libsvm"))
    normalize: str = _f("l2", "input row scaling: none | l2 | tfidf_l2", choices=("none", "l2", "tfidf_l2"))
    standardize: Union[bool, str] = _f("auto", "standardize each feature by the training rows' mean and standard "
                                                "deviation before the row scaling: true | false | auto (when at "
                                                "least half the training matrix's entries are stored: dense "
                                                "real-valued features, not text; an ensemble then "
                                                "chooses on validation whether to keep it)", auto=True)
    cache: bool = _f(True, "keep a binary cache of parsed files (reused only while the source is unchanged)")


@dataclass
class LshConfig:
    family: str = _f("dwta", "hash family: simhash | wta | dwta", choices=("simhash", "wta", "dwta"))
    K: int = _f(6, "hash codes concatenated per table", min=1, max=32)
    L: int = _f(50, "number of hash tables", min=1, max=1024)
    range_pow: int = _f(0, "bits of a bucket id per table; 0 = derived from K and the family", min=0, max=30)
    bucket_capacity: int = _f(128, "neurons kept per bucket", min=1)
    bucket_policy: str = _f("fifo", "when a bucket is full: fifo | reservoir", choices=("fifo", "reservoir"))
    selection: str = _f("vanilla", "active set from buckets: vanilla (union) | topk (by count) | threshold",
                        choices=("vanilla", "topk", "threshold"))
    threshold: int = _f(2, "selection=threshold: minimum number of tables a neuron must appear in", min=1)
    min_active: int = _f(1000, "random neurons fill the active set up to this size", min=0)
    max_active: int = _f(4000, "active set is cut to this size (true labels always kept); 0 = no limit", min=0)
    negative_weight: float = _f(1.0, "sigmoid output layer only: weight of each sampled negative in the "
                                     "per-label binary loss (positives weigh 1); 0 = importance weights (each "
                                     "random negative stands for all the labels it was drawn from)", min=0.0)


@dataclass
class LayerConfig:
    size: Optional[int] = _f(None, "neurons; null on the last layer = number of labels", min=1)
    activation: str = _f("relu", "relu | linear on hidden layers (default relu); on the last layer (default "
                                 "auto) softmax (softmax "
                                 "cross-entropy, target mass 1/|y|) | sigmoid (per-label binary cross-entropy, on "
                                 "the sampled neurons of an lsh layer) | auto (sigmoid when the output layer is "
                                 "dense, else softmax)",
                         choices=("relu", "softmax", "linear", "sigmoid", "auto"))
    sampling: str = _f("auto", "dense (all neurons) | lsh (hash-selected) | auto (chosen by cost at start-up)",
                       choices=("auto", "dense", "lsh"))
    lsh: LshConfig = _f(LshConfig(), "hash settings, used when sampling is lsh (or auto picks lsh)")
    init: str = _f("glorot", "initial weights: glorot (random normal) | centroid (output layer only: each "
                             "label's row starts as the mean hidden representation of its training points, "
                             "scaled to length 10; labels without points keep glorot)",
                   choices=("glorot", "centroid"))
    precision: str = _f("fp32", "storage of the weights and their Adam moments: fp32 | bf16 (bfloat16, half the "
                                "bytes, float32 arithmetic; AVX512_BF16 instructions where the CPU has them, an "
                                "exact fallback elsewhere). bf16 is allowed on the first and the output layer",
                        choices=("fp32", "bf16"))
    centroid_weight: Union[float, str] = _f("auto", "output layer only: each label's score adds this weight x the "
                                                    "cosine between the input row and the label's centroid of "
                                                    "the training input (slide.centroids); auto = chosen on "
                                                    "validation data (off without it), 0 = off",
                                             min=0.0, auto=True)
    centroid_kind: str = _f("auto", "output layer only: the label vectors of that term: mean (the label "
                                    "centroids, cosine) | ridge (each label's ridge regression on the scaled "
                                    "input rows: dense, for small problems) | auto (with centroid_weight auto: "
                                    "chosen on validation, ridge tried where it fits; with a set weight: mean)",
                            choices=("auto", "mean", "ridge"))


def _default_layers() -> List[LayerConfig]:
    return [LayerConfig(size=1024, activation="relu", sampling="dense"),
            LayerConfig(size=None, activation="auto", sampling="auto")]


@dataclass
class OptimizerConfig:
    name: str = _f("adam", "optimizer: adam (fused, sparse rows)", choices=("adam",))
    lr: float = _f(4e-3, "learning rate", gt=0.0)
    betas: List[float] = _f([0.9, 0.999], "Adam moment decay rates [beta1, beta2], each in [0, 1)")
    eps: float = _f(1e-8, "Adam epsilon", gt=0.0)
    lr_search: List[float] = _f([0.5, 2.0], "epochs=auto on a small problem (a cheap search): also search at "
                                            "lr x each factor; another rate is kept when it beats lr on the "
                                            "validation rows by one standard error of the paired "
                                            "difference; [] = off")
    weight_decay: float = _f(0.0, "decoupled weight decay on touched rows", min=0.0)
    warmup_steps: int = _f(0, "linear learning-rate warm-up over this many steps", min=0)
    lr_decay: float = _f(0.85, "multiply the learning rate by this after each epoch, or after every "
                                "lr_decay_min_steps batches when an epoch is shorter (1 = off)", gt=0.0, max=1.0)
    lr_decay_min_steps: int = _f(50, "lr_decay applies at most once per this many batches, so that small "
                                     "data sets (few batches per epoch) are not starved of steps", min=1)
    lr_plateau: float = _f(1.0, "multiply the learning rate by this when validation P@1 has not improved for "
                                "lr_plateau_patience evaluations (1 = off; needs validation data)", gt=0.0, max=1.0)
    lr_plateau_patience: int = _f(2, "evaluations without a better validation P@1 before lr_plateau applies", min=1)


@dataclass
class TrainingConfig:
    epochs: Union[int, str] = _f("auto", "passes over the training set, or auto: train on a held-out split of "
                                         "train until validation P@1 (training.monitor) stops improving, then "
                                         "refit on all of train for the best length (see refit)", min=1, auto=True)
    ensemble: Union[int, str] = _f("auto", "epochs=auto: train this many networks (training.seed, +1000, +2000, ...; "
                                           "each with its own validation split, search and refit) and merge them "
                                           "into one network that ranks by the mean of their scores (hidden layers "
                                           "side by side, slide.ensemble); auto = 3 when the first network's "
                                           "training was cheap (small problems, one process, no time_budget), "
                                           "else 1", min=1, max=16, auto=True)
    max_epochs: int = _f(300, "epochs=auto: at most this many epochs", min=1)
    time_budget: float = _f(0.0, "stop training after this many seconds of training (epochs=auto gives half "
                                 "to the search and the rest to the refit); 0 = no limit", min=0.0)
    refit: bool = _f(True, "epochs=auto with a split held out of train: after the search, retrain from the "
                           "start on all of train for the best number of epochs, replaying the search's "
                           "learning rates (false: keep the best weights of the search)")
    batch_size: int = _f(128, "samples per batch (run in parallel, HOGWILD)", min=1)
    threads: int = _f(0, "CPU threads; 0 = all cores", min=0, max=1024)
    seed: int = _f(0, "seed for shuffling, initialisation and hashing", min=0, max=2**63 - 1)
    dropout: float = _f(0.7, "dropout on hidden layer outputs during training", min=0.0, lt=1.0)
    rebuild_first: int = _f(50, "hash tables are first rebuilt after this many batches", min=1)
    rebuild_decay: float = _f(0.1, "each later rebuild gap grows by exp(rebuild_decay)", min=0.0)
    eval_every: int = _f(0, "evaluate every N batches; 0 = at the end of each epoch", min=0)
    eval_samples: int = _f(0, "evaluate on at most this many points during training; 0 = all", min=0)
    test_every: Union[int, str] = _f("auto", "during training, evaluate the test split (shown and recorded, never "
                                             "used to choose) at every N-th end of epoch and at the last epoch of "
                                             "the count; auto = every epoch of a phase of at most 20 epochs, else "
                                             "about 20 times a phase (the search of epochs=auto counts "
                                             "max_epochs), skipping one while the test evaluations have taken "
                                             "over a tenth of the training seconds (past 10 s); evaluations "
                                             "every eval_every batches always score it, and the final "
                                             "evaluation is always of the whole test set",
                                     min=1, auto=True)
    checkpoint_every: Union[int, str] = _f("auto", "write a checkpoint every N epochs; 0 = only at the end (and "
                                                   "after Ctrl-C); auto = at the end of the first epoch, then at "
                                                   "the end of an epoch once 20 times what the last checkpoint "
                                                   "took to write has passed since it (checkpoints cost at most "
                                                   "about 5% of the run)", min=0, auto=True)
    checkpoint_minutes: float = _f(10.0, "also checkpoint when this many minutes passed; 0 = off", min=0.0)
    patience: int = _f(10, "early stopping: evaluations without a better validation P@1 (training.monitor; "
                           "and at least 2 x optimizer.lr_decay_min_steps batches); 0 = off (used only when "
                           "there is validation data)", min=0)
    patience_samples: int = _f(250_000, "early stopping also once this many training samples passed without a "
                                        "better validation P@1 (training.monitor; at least 3 evaluations): on "
                                        "large data an epoch is many updates and its validation split (up to "
                                        "5,000 points) is steady; 0 = off", min=0)
    monitor: str = _f("P@1", "the validation metric whose best the epochs=auto search, early stopping, "
                             "restore_best, the learning-rate search and an ensemble's standardization vote "
                             "keep: P@k with k one of eval.k (P@3 or P@5 where the ranking below the first "
                             "label is what counts; the label-centroid weight is chosen on P@1 either way)")
    restore_best: bool = _f(True, "after training, restore the weights of the best validation evaluation "
                                  "(a copy of the weights and Adam moments is kept for it, unless epochs=auto refits)")
    shared_negatives: Union[bool, str] = _f("auto", "hash-sampled output layer: score the negatives a batch's "
                                                     "samples share (the batch's labels and one uniform fill) as one "
                                                     "block per batch: true | false | auto (from 65,536 output "
                                                     "neurons; one process only)", auto=True)
    rebuild_spread: int = _f(0, "spread each table rebuild over this many batches, the old tables serving "
                                "meanwhile: 0 = auto (layers of 131,072 neurons or more, over "
                                "min(64, rebuild_first / 2) batches), 1 = at once", min=0)
    hugepages: bool = _f(True, "ask for transparent hugepages for large arrays (falls back quietly)")
    recompute: bool = _f(False, "networks without hash-sampled layers: keep only checkpoint layers' outputs of a "
                                "batch and recompute the other hidden activations and dropout masks in the "
                                "backward pass (less activation memory, same results, some more compute); an "
                                "error on networks with a hash-sampled layer")


@dataclass
class EvalConfig:
    k: List[int] = _f([1, 3, 5], "k values for P@k, nDCG@k, PSP@k")
    propensity_a: float = _f(0.55, "propensity model A (Jain et al. 2016); 0.6 for Amazon")
    propensity_b: float = _f(1.5, "propensity model B (Jain et al. 2016); 2.6 for Amazon")


@dataclass
class Config:
    data: DataConfig = _f(DataConfig(), "where the data is and how it is read")
    layers: List[LayerConfig] = _f(_default_layers(), "layers from input to output; the last is the output layer")
    optimizer: OptimizerConfig = _f(OptimizerConfig(), "optimizer settings")
    training: TrainingConfig = _f(TrainingConfig(), "training loop settings")
    eval: EvalConfig = _f(EvalConfig(), "evaluation settings")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]], *, source: str = "config") -> "Config":
        """Build and validate a Config from a (possibly partial) nested dict."""
        if d is None:
            d = {}
        cfg = _build(cls, d, prefix="", source=source)
        layers = d.get("layers") if isinstance(d, dict) else None
        if isinstance(layers, list) and layers and isinstance(layers[-1], dict) and "activation" not in layers[-1]:
            cfg.layers[-1].activation = "auto"   # an output layer that names no loss gets the default one
        cfg.validate(source=source)
        return cfg

    @classmethod
    def from_yaml(cls, path: Union[str, os.PathLike]) -> "Config":
        """Read a YAML file; relative data paths are resolved against the file's folder."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"config file not found: {path}")
        with open(path, "r", encoding="utf-8") as fh:
            try:
                d = yaml.safe_load(fh)
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: not valid YAML: {e}") from None
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}): {e.reason}") from None
            except RecursionError:
                raise ConfigError(f"{path}: YAML nested too deeply to be a configuration") from None
        if d is not None and not isinstance(d, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(d).__name__}")
        try:
            cfg = cls.from_dict(d, source=path)
        except RecursionError:
            raise ConfigError(f"{path}: YAML nested too deeply to be a configuration") from None
        base = os.path.dirname(os.path.abspath(path))
        for key in ("train", "test", "valid"):
            p = getattr(cfg.data, key)
            if p and not os.path.isabs(os.path.expanduser(p)):
                setattr(cfg.data, key, os.path.normpath(os.path.join(base, p)))
        return cfg

    @classmethod
    def load(cls, source: Union[None, str, os.PathLike, Dict[str, Any], "Config"]) -> "Config":
        """Accept a Config, a dict, a YAML path or None (defaults)."""
        if source is None:
            return cls()
        if isinstance(source, Config):
            return source.copy()
        if isinstance(source, dict):
            return cls.from_dict(source)
        if isinstance(source, (str, os.PathLike)):
            return cls.from_yaml(source)
        raise TypeError(f"config must be a dict, a YAML path or a slide.Config, got {type(source).__name__}")

    def copy(self) -> "Config":
        return copy.deepcopy(self)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def save(self, path: Union[str, os.PathLike]) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_yaml())

    def with_overrides(self, assignments: List[str]) -> "Config":
        """Apply ``key.sub=value`` strings (``--set`` on the CLI); values are parsed as YAML.

        List items are addressed by index: ``layers.1.sampling=lsh``.
        """
        d = self.to_dict()
        for a in assignments:
            if "=" not in a:
                raise ConfigError(f"--set expects key=value, got {a!r}")
            key, raw = a.split("=", 1)
            key = key.strip()
            try:
                value = yaml.safe_load(raw) if raw.strip() != "" else None
            except yaml.YAMLError:
                value = raw
            _assign(d, key, value)
        return Config.from_dict(d, source="--set")

    # ------------------------------------------------------------------ validation
    def validate(self, source: str = "config") -> None:
        """Cross-field checks (single fields are checked while building)."""
        def err(key: str, msg: str):
            raise ConfigError(f"{source}: {key}: {msg}")

        if not self.layers:
            err("layers", "at least one layer (the output layer) is needed")
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            if layer.activation in OUTPUT_ACTIVATIONS and not last:
                err(f"layers.{i}.activation", f"{layer.activation} is only allowed on the last (output) layer")
            if layer.size is None and not last:
                err(f"layers.{i}.size", "hidden layers need a size")
            lsh = layer.lsh
            if lsh.max_active and lsh.min_active > lsh.max_active:
                err(f"layers.{i}.lsh.min_active",
                    f"{lsh.min_active} is larger than max_active={lsh.max_active}")
            bits = _lsh_code_bits(lsh)
            if lsh.range_pow > bits:
                what = "K" if lsh.family == "simhash" else f"K*log2(bin_size={WTA_BIN_SIZE})"
                err(f"layers.{i}.lsh.range_pow",
                    f"{lsh.family} gives {what}={bits} bits per table, range_pow={lsh.range_pow} cannot exceed it")
            if layer.init == "centroid" and (not last or i == 0):
                err(f"layers.{i}.init", "centroid initialises the output layer after a hidden layer only"
                    if last else "centroid is only allowed on the last (output) layer")
            if not last and layer.centroid_weight not in ("auto", 0.0):
                err(f"layers.{i}.centroid_weight", "the label-centroid term belongs to the last (output) layer")
            if not last and layer.centroid_kind != "auto":
                err(f"layers.{i}.centroid_kind", "the label-centroid term belongs to the last (output) layer")
            if layer.precision == "bf16" and 0 < i < len(self.layers) - 1:
                err(f"layers.{i}.precision",
                    "bf16 is supported on the first layer and the output layer, not on middle hidden layers")
            if i == 0 and layer.sampling == "lsh":
                err(f"layers.{i}.sampling",
                    "lsh needs a dense hidden layer before it (the first layer reads the sparse input)")
        out = self.layers[-1]
        if out.activation not in OUTPUT_ACTIVATIONS:
            err(f"layers.{len(self.layers) - 1}.activation",
                f"the output layer must use softmax, sigmoid or auto, got {out.activation!r}")
        b = self.optimizer.betas
        if len(b) != 2 or not all(0.0 <= x < 1.0 for x in b):
            err("optimizer.betas", f"expected two numbers in [0, 1), got {b}")
        f = self.optimizer.lr_search
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 < x < float("inf")
                   for x in f):
            err("optimizer.lr_search", f"expected a list of positive factors (or []), got {f}")
        if not self.eval.k or any((not isinstance(k, int)) or k < 1 for k in self.eval.k):
            err("eval.k", f"expected a list of positive integers, got {self.eval.k}")
        if monitor_k(self.training.monitor) not in self.eval.k:
            err("training.monitor", f"expected P@k with k one of eval.k {list(self.eval.k)}, got "
                                    f"{self.training.monitor!r}")
        if not (0.0 <= self.data.valid_fraction < 1.0):
            err("data.valid_fraction", f"must be in [0, 1), got {self.data.valid_fraction}")

    def check_files(self, source: str = "config", need_train: bool = True) -> None:
        """Raise FileNotFoundError naming the key when a configured data file is missing."""
        if need_train and not self.data.train:
            raise ConfigError(f"{source}: data.train: no training file given")
        for key in ("train", "test", "valid"):
            p = getattr(self.data, key)
            if p and not os.path.exists(os.path.expanduser(p)):
                raise FileNotFoundError(f"{source}: data.{key}: file not found: {p}")


# ---------------------------------------------------------------------- helpers

# Activations of the output layer (each also names its loss); auto is resolved when the
# network is built (slide.sampling.resolve_output_activation).
OUTPUT_ACTIVATIONS = ("softmax", "sigmoid", "auto")

# WTA/DWTA coordinates per hash code: fixed, not a configuration key (log2(8) = 3 bits a code).
WTA_BIN_SIZE = 8


def _lsh_code_bits(lsh: "LshConfig") -> int:
    """Bits of code per table, from the engine's one rule (range_pow may not exceed it)."""
    from . import _core

    return int(_core.lsh_code_bits(lsh.family, int(lsh.K), WTA_BIN_SIZE))


def _suggest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _check_number(key, value, meta, source):
    def err(msg):
        raise ConfigError(f"{source}: {key}: {msg}")
    if "min" in meta and value < meta["min"]:
        err(f"must be >= {meta['min']}, got {value}")
    if "max" in meta and value > meta["max"]:
        err(f"must be <= {meta['max']}, got {value}")
    if "gt" in meta and not value > meta["gt"]:
        err(f"must be > {meta['gt']}, got {value}")
    if "lt" in meta and not value < meta["lt"]:
        err(f"must be < {meta['lt']}, got {value}")


def _convert(key: str, tp, value, meta, source):
    def err(msg):
        raise ConfigError(f"{source}: {key}: {msg}")

    if meta.get("auto") and isinstance(value, str):
        if value != "auto":
            first = get_args(tp)[:1]
            kind = "true, false" if first == (bool,) else "a number" if first == (float,) else "an integer"
            err(f"expected {kind} or auto, got {value!r}")
        return value
    origin = get_origin(tp)
    if origin is Union:  # Optional[X] or Union[int, str] (the str being "auto")
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(key, args[0], value, meta, source)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            err(f"expected a mapping, got {type(value).__name__} {value!r}")
        return _build(tp, value, prefix=key + ".", source=source)
    if origin in (list, List):
        (item_tp,) = get_args(tp)
        if not isinstance(value, (list, tuple)):
            err(f"expected a list, got {type(value).__name__} {value!r}")
        return [_convert(f"{key}.{i}", item_tp, v, {}, source) for i, v in enumerate(value)]
    if value is None:
        err("must not be null")
    if tp is bool:
        if not isinstance(value, bool):
            err(f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                err(f"expected an integer, got {type(value).__name__} {value!r}")
        _check_number(key, value, meta, source)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    err(f"expected a number, got {value!r}")
            else:
                err(f"expected a number, got {type(value).__name__} {value!r}")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            err(f"must be finite, got {value}")
        _check_number(key, value, meta, source)
        return value
    if tp is str:
        if not isinstance(value, str):
            err(f"expected a string, got {type(value).__name__} {value!r}")
        choices = meta.get("choices")
        if choices and value not in choices:
            err(f"must be one of {', '.join(choices)}; got {value!r}{_suggest(value, choices)}")
        return value
    return value


def _build(cls, d: Dict[str, Any], prefix: str, source: str):
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'}: expected a mapping, got {d!r}")
    hints = get_type_hints(cls)
    names = {f.name: f for f in fields(cls)}
    for k in d:
        if k not in names:
            raise ConfigError(f"{source}: unknown key '{prefix}{k}'{_suggest(str(k), names)}")
    kwargs = {}
    for name, f in names.items():
        if name in d:
            kwargs[name] = _convert(prefix + name, hints[name], d[name], f.metadata, source)
    return cls(**kwargs)


def _assign(d: Any, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[: i + 1])
        if isinstance(cur, list):
            if not re.fullmatch(r"-?[0-9]+", p):
                raise ConfigError(f"--set: {where}: list items are addressed by index")
            idx = int(p)
            if not -len(cur) <= idx < len(cur):
                raise ConfigError(f"--set: {where}: index out of range (list has {len(cur)} items)")
            if last:
                cur[idx] = value
            else:
                cur = cur[idx]
        elif isinstance(cur, dict):
            if p not in cur:
                raise ConfigError(f"--set: unknown key '{where}'{_suggest(p, cur.keys())}")
            if last:
                cur[p] = value
            else:
                cur = cur[p]
        else:
            raise ConfigError(f"--set: {where}: '{'.'.join(parts[:i])}' is not a section")


def _yaml_scalar(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def _emit(obj, indent: int, lines: List[str]) -> None:
    pad = "  " * indent
    for f in fields(obj):
        v = getattr(obj, f.name)
        doc = f.metadata.get("doc", "")
        if dataclasses.is_dataclass(v):
            lines.append(f"{pad}{f.name}:  # {doc}")
            _emit(v, indent + 1, lines)
        elif isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
            lines.append(f"{pad}{f.name}:  # {doc}")
            for item in v:
                sub: List[str] = []
                _emit(item, indent + 2, sub)
                first = sub[0].lstrip()
                lines.append(f"{pad}  - {first}")
                lines.extend(sub[1:])
        else:
            lines.append(f"{pad}{f.name}: {_yaml_scalar(v)}  # {doc}")


def defaults_yaml() -> str:
    """The full default configuration as YAML with a comment on every key."""
    lines = ["# slide configuration: every key with its default value"]
    _emit(Config(), 0, lines)
    return "\n".join(lines) + "\n"
