"""Dense PyTorch baseline: the network of a slide config, trained on every output neuron.

The model mirrors what :class:`slide.Network` trains for the same :class:`slide.Config`:

* the sparse input row (scaled as ``data.normalize`` says, L2 by default) enters the first layer
  through ``nn.EmbeddingBag(num_features, size, mode="sum")`` with the feature values as
  ``per_sample_weights`` (a sparse-times-dense product that never densifies the input), plus a
  bias;
* the hidden layers of the config follow with ReLU (and ``training.dropout`` on their outputs);
* the output layer is a full dense ``nn.Linear`` over all labels: no sampling, which is exactly
  the cost slide avoids;
* the loss is the output layer's: softmax cross-entropy against a target that gives each of a
  point's ``|y|`` labels mass ``1/|y|`` (``activation: softmax``), or a binary cross-entropy per
  label (``sigmoid``, and ``auto``, which is sigmoid on a dense output layer as this one is);
  training points without a label are skipped;
* Adam (AdamW when ``optimizer.weight_decay > 0``) with ``fused=True`` where the device supports
  it, else the ``foreach`` implementation; same learning rate, betas, epsilon, warm-up, per-epoch
  decay, batch size, seed and thread count as the config.

``torch`` is optional (``pip install slide[torch]``); it is imported when a trainer is built.

Example::

    from slide.baselines.torch_dense import TorchDenseTrainer
    t = TorchDenseTrainer(config, train.num_features, train.num_labels)
    history = t.fit_for(train, seconds=60, test=test, eval_at=[10, 30, 60])
    labels, scores = t.predict_topk(test.features, k=5)
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import scipy.sparse as sp

from ..config import Config
from . import as_csr_pair, evaluate_topk, idf_weights, normalize_rows, standardization_for, threads_for
from ..scaling import standardize

__all__ = ["TorchDenseTrainer", "import_torch", "require_torch", "resolve_device"]

_INSTALL_HINT = ("the dense PyTorch baseline needs PyTorch: install it with "
                 "`pip install slide[torch]` (or `pip install torch`)")


# Scores of one evaluation chunk (rows x labels floats): 64 MiB, far below the model itself.
EVAL_CHUNK_FLOATS = 1 << 24

def import_torch():
    """Import torch, or raise ImportError saying how to install it."""
    try:
        import torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised by monkeypatching in tests
        raise ImportError(f"{_INSTALL_HINT} ({e})") from None
    return torch


def require_torch() -> None:
    """Raise the ImportError of :func:`import_torch` when torch is not installed, without
    importing it (importing torch takes seconds)."""
    import importlib.util
    import sys
    if "torch" in sys.modules:
        if sys.modules["torch"] is None:
            import_torch()  # raises
        return
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(_INSTALL_HINT)


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` becomes ``"cuda"`` when a CUDA device is usable, else ``"cpu"``.

    Asking for ``"cuda"`` without a usable device raises ``RuntimeError``.
    """
    torch = import_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch {torch.__version__} sees no CUDA device")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be cpu, cuda or auto; got {device!r}")
    return device


class TorchDenseTrainer:
    """Train the dense equivalent of ``config`` for a time or epoch budget.

    Parameters
    ----------
    config:
        a :class:`slide.Config`, a dict or a YAML path (anything :meth:`Config.load` accepts).
    num_features, num_labels:
        input width and number of output neurons (the last layer's size when it is set).
    device:
        ``"cpu"``, ``"cuda"`` (``"cuda:1"``...) or ``"auto"``.

    Not thread-safe: one trainer is used by one thread at a time.
    """

    def __init__(self, config=None, num_features: int = None, num_labels: int = None,
                 device: str = "cpu"):
        torch = import_torch()
        self._torch = torch
        self.config = Config.load(config)
        if num_features is None or num_labels is None:
            raise ValueError("TorchDenseTrainer needs num_features and num_labels")
        if num_features < 1 or num_labels < 1:
            raise ValueError(f"num_features and num_labels must be >= 1, got {num_features}, {num_labels}")
        self.num_features = int(num_features)
        out = self.config.layers[-1].size
        self.num_labels = int(out) if out else int(num_labels)
        # the output layer is dense here, so activation auto means sigmoid (as in slide.Network)
        self.binary = self.config.layers[-1].activation in ("sigmoid", "auto")
        self.device = resolve_device(device)
        self.threads = threads_for(self.config)
        self.step = 0
        self.epoch = 0
        self.samples_seen = 0
        self.train_seconds = 0.0
        self.stop_training = False
        self._idf: Optional[np.ndarray] = None
        self._standard = None   # data.standardize: (mean, scale) of the training features
        self._standard_fixed = False
        self._props: Optional[np.ndarray] = None

        tr = self.config.training
        saved_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            gen = torch.Generator().manual_seed(tr.seed)
            self.model = self._build(gen).to(self.device)
        finally:
            torch.set_num_threads(saved_threads)
        self.optimizer, self.optimizer_impl = self._make_optimizer()

    # ------------------------------------------------------------------ model
    def _build(self, gen):
        torch = self._torch
        nn = torch.nn
        sizes = [l.size for l in self.config.layers[:-1]] + [self.num_labels]
        dropout = self.config.training.dropout

        def uniform_(t, fan_in, fan_out):
            # Glorot-uniform: keeps activations of L2-scaled inputs O(1) whatever the layer width.
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            with torch.no_grad():
                t.uniform_(-bound, bound, generator=gen)

        class DenseNet(nn.Module):
            def __init__(self, num_features):
                super().__init__()
                self.embed = nn.EmbeddingBag(num_features, sizes[0], mode="sum")
                uniform_(self.embed.weight, num_features, sizes[0])
                self.embed_bias = nn.Parameter(torch.zeros(sizes[0]))
                self.hidden = nn.ModuleList()
                for a, b in zip(sizes[:-1], sizes[1:]):
                    lin = nn.Linear(a, b)
                    uniform_(lin.weight, a, b)
                    nn.init.zeros_(lin.bias)
                    self.hidden.append(lin)
                self.dropout = nn.Dropout(dropout) if dropout > 0 else None

            def forward(self, indices, offsets, values):
                h = self.embed(indices, offsets, per_sample_weights=values) + self.embed_bias
                for lin in self.hidden:
                    h = torch.relu(h)
                    if self.dropout is not None:
                        h = self.dropout(h)
                    h = lin(h)
                return h  # logits of the output layer

        return DenseNet(self.num_features)

    def _make_optimizer(self):
        torch = self._torch
        opt = self.config.optimizer
        cls = torch.optim.AdamW if opt.weight_decay > 0 else torch.optim.Adam
        kw = dict(lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay)
        params = list(self.model.parameters())
        try:
            o = cls(params, fused=True, **kw)
            # Some builds accept the flag and fail only at the first step: try one no-op step.
            for p in params:
                p.grad = torch.zeros_like(p)
            saved = [p.detach().clone() for p in params]
            o.step()
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
                    p.grad = None
            o = cls(params, fused=True, **kw)  # fresh moments
            return o, "fused"
        except (RuntimeError, TypeError, ValueError):
            for p in params:
                p.grad = None
            return cls(params, foreach=True, **kw), "foreach"

    # ------------------------------------------------------------------ data
    def _prepare(self, features: sp.csr_matrix, fit_idf: bool = False) -> sp.csr_matrix:
        mode = self.config.data.normalize
        if features.shape[1] > self.num_features:
            raise ValueError(f"data has {features.shape[1]} features, the model was built for "
                             f"{self.num_features}")
        if mode == "tfidf_l2" and (fit_idf or self._idf is None):
            if not fit_idf:
                raise RuntimeError("tfidf_l2 scaling needs the training data first (call fit_for)")
            self._idf = idf_weights(features)
        if fit_idf and not self._standard_fixed:   # the first training data: data.standardize's statistics
            self._standard = standardization_for(self.config, features, self.num_features)
            self._standard_fixed = True
        if self._standard is not None:
            features = standardize(features, *self._standard)
        return normalize_rows(features, mode, self._idf)

    def _batch_tensors(self, x: sp.csr_matrix, rows: np.ndarray):
        torch = self._torch
        sub = x[rows]
        dev = self.device
        indices = torch.from_numpy(sub.indices.astype(np.int64)).to(dev, non_blocking=True)
        offsets = torch.from_numpy(sub.indptr[:-1].astype(np.int64)).to(dev, non_blocking=True)
        values = torch.from_numpy(sub.data).to(dev, non_blocking=True)
        return indices, offsets, values

    def _targets(self, y: sp.csr_matrix, rows: np.ndarray, width: int):
        """Flat positions ``row * width + label`` and weights ``1/|y|`` of a batch's labels."""
        torch = self._torch
        sub = y[rows]
        counts = np.diff(sub.indptr)
        row_of = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        flat = row_of * width + sub.indices.astype(np.int64)
        w = np.repeat(1.0 / counts, counts).astype(np.float32)
        return (torch.from_numpy(flat).to(self.device, non_blocking=True),
                torch.from_numpy(w).to(self.device, non_blocking=True))

    # ------------------------------------------------------------------ training
    def _lr_at(self, step: int, epoch: int) -> float:
        opt = self.config.optimizer
        lr = opt.lr * (opt.lr_decay ** epoch)
        if opt.warmup_steps > 0 and step < opt.warmup_steps:
            lr *= (step + 1) / opt.warmup_steps
        return lr

    def _sync(self):
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize(self.device)

    def fit_for(self, train, seconds: Optional[float] = None, epochs: Optional[int] = None,
                test=None, eval_at: Sequence[float] = (), eval_samples: int = 0,
                k: Sequence[int] = (1, 3, 5),
                callback: Optional[Callable[["TorchDenseTrainer", Dict[str, Any]], None]] = None,
                propensities: Optional[np.ndarray] = None) -> List[Dict[str, Any]]:
        """Train until ``seconds`` of training time or ``epochs`` passes, whichever comes first.

        ``seconds`` counts training only: the clock pauses while the test set is evaluated, so
        the marks of two systems compare the same amount of training. When neither budget is
        given, ``config.training.epochs`` is used.

        ``eval_at`` lists training-time marks (seconds) at which ``test`` is evaluated (at the
        first batch boundary past each mark); the end of training is always evaluated when
        ``test`` is given. ``eval_samples > 0`` evaluates a fixed seeded subset of the test
        points. ``callback(trainer, record)`` runs after each evaluation and may set
        ``trainer.stop_training = True``. ``propensities`` (one per label) are passed to
        :func:`slide.metrics.evaluate` for PSP@k; by default they come from the test labels.

        Returns the evaluation records, each a dict with ``step``, ``epoch``, ``seconds``
        (training time), ``samples``, ``samples_per_second``, ``loss`` (mean since the previous
        record) and the metric keys of :func:`slide.metrics.evaluate` (``P@1``...). Calling it
        again continues training where it stopped; ``seconds`` and the marks then count the
        trainer's total training time, ``epochs`` the passes of this call.
        """
        torch = self._torch
        tr = self.config.training
        if seconds is None and epochs is None:
            epochs = tr.epochs
        x, y = as_csr_pair(train)
        if y is None:
            raise ValueError("fit_for needs training labels")
        if y.shape[1] > self.num_labels:
            raise ValueError(f"training labels have {y.shape[1]} columns, the model has "
                             f"{self.num_labels} outputs")
        x = self._prepare(x, fit_idf=self._idf is None)
        y = sp.csr_matrix(y)
        keep = np.flatnonzero(np.diff(y.indptr) > 0)  # points with no label carry no target
        if keep.size == 0:
            raise ValueError("no training point has a label")
        test_eval = self._eval_subset(test, eval_samples) if test is not None else None
        self._props = propensities

        marks = sorted(float(m) for m in eval_at if seconds is None or m <= seconds + 1e-9)
        next_mark = 0
        records: List[Dict[str, Any]] = []
        rng = np.random.default_rng(tr.seed + self.epoch)
        bs = tr.batch_size
        width = self.num_labels
        start_epoch = self.epoch
        loss_sum, loss_n = torch.zeros((), device=self.device), 0
        last_step = self.step
        last_samples = self.samples_seen
        last_time = self.train_seconds
        self.stop_training = False

        saved_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self.model.train()
        try:
            t0 = time.perf_counter() - self.train_seconds
            paused = 0.0
            done = False
            while not done:
                order = keep[rng.permutation(keep.size)]
                for b in range(0, order.size, bs):
                    rows = order[b:b + bs]
                    ind, off, val = self._batch_tensors(x, rows)
                    flat, w = self._targets(y, rows, width)
                    lr = self._lr_at(self.step, self.epoch)
                    for g in self.optimizer.param_groups:
                        g["lr"] = lr
                    logits = self.model(ind, off, val)
                    if self.binary:
                        # per-label binary cross-entropy: sum_il softplus(z_il) - sum_{l in y_i} z_il
                        loss = (torch.nn.functional.softplus(logits).sum()
                                - logits.reshape(-1).index_select(0, flat).sum()) / rows.size
                    else:
                        # softmax cross-entropy with target mass 1/|y| on each true label:
                        # sum_i [logsumexp(z_i) - sum_{l in y_i} z_il / |y_i|], without a dense target.
                        loss = (torch.logsumexp(logits, dim=1).sum()
                                - (logits.reshape(-1).index_select(0, flat) * w).sum()) / rows.size
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                    self.step += 1
                    self.samples_seen += rows.size
                    loss_sum += loss.detach()  # no per-batch device sync
                    loss_n += 1
                    elapsed = time.perf_counter() - t0 - paused
                    over = seconds is not None and elapsed >= seconds
                    due = next_mark < len(marks) and elapsed >= marks[next_mark]
                    if due or over:
                        self._sync()
                        elapsed = time.perf_counter() - t0 - paused
                        while next_mark < len(marks) and elapsed >= marks[next_mark]:
                            next_mark += 1
                        self.train_seconds = elapsed
                        if test_eval is not None:
                            te = time.perf_counter()
                            rec = self._record(test_eval, k, float(loss_sum) / max(loss_n, 1),
                                               last_step, last_samples, last_time)
                            records.append(rec)
                            last_step, last_samples, last_time = self.step, self.samples_seen, elapsed
                            loss_sum, loss_n = torch.zeros((), device=self.device), 0
                            if callback is not None:
                                callback(self, rec)
                            self.model.train()
                            paused += time.perf_counter() - te
                    if over or self.stop_training:
                        done = True
                        break
                if not done:
                    self.epoch += 1
                    if epochs is not None and self.epoch - start_epoch >= epochs:
                        done = True
            self._sync()
            self.train_seconds = time.perf_counter() - t0 - paused
            if test_eval is not None and (not records or records[-1]["step"] != self.step):
                rec = self._record(test_eval, k, float(loss_sum) / max(loss_n, 1),
                                   last_step, last_samples, last_time)
                records.append(rec)
                if callback is not None:
                    callback(self, rec)
        finally:
            torch.set_num_threads(saved_threads)
        return records

    def _eval_subset(self, test, eval_samples: int):
        x, y = as_csr_pair(test)
        if y is None:
            raise ValueError("the test set needs labels to be evaluated")
        if eval_samples and eval_samples < x.shape[0]:
            pick = np.sort(np.random.default_rng(self.config.training.seed).choice(
                x.shape[0], eval_samples, replace=False))
            x, y = x[pick], y[pick]
        return x, y

    def _record(self, test_eval, k, loss, last_step, last_samples, last_time) -> Dict[str, Any]:
        from ..metrics import evaluate
        x, y = test_eval
        top, _ = self.predict_topk(x, max(k))
        metrics = evaluate(top, y, k=tuple(k), propensities=self._props)
        dt = self.train_seconds - last_time
        rec: Dict[str, Any] = {
            "step": self.step,
            "epoch": self.epoch,
            "seconds": self.train_seconds,
            "samples": self.samples_seen,
            "samples_per_second": (self.samples_seen - last_samples) / dt if dt > 0 else float("nan"),
            "loss": loss,
        }
        rec.update({key: float(v) for key, v in metrics.items()})
        return rec

    # ------------------------------------------------------------------ inference
    def predict_topk(self, X, k: int = 5, batch_size: Optional[int] = None):
        """Top-``k`` labels and their probabilities (softmax, or per-label sigmoid) for each row of ``X``.

        ``X`` is a CSR matrix (or a Dataset, or anything :func:`as_csr_pair` accepts) of raw
        features: it is scaled as in training. Returns ``(labels int32 [n, k], scores float32
        [n, k])``, best first. Rows are scored ``batch_size`` at a time; by default as many as
        keep one chunk's scores within :data:`EVAL_CHUNK_FLOATS` floats (4,096 rows for a few
        thousand labels, 25 for 670,091), so that evaluation never sets the peak memory, as a
        careful user would write it.
        """
        if batch_size is None:
            batch_size = max(1, min(4096, EVAL_CHUNK_FLOATS // max(1, self.num_labels)))
        torch = self._torch
        x, _ = as_csr_pair(X)
        x = self._prepare(x)
        k = int(k)
        if not 1 <= k <= self.num_labels:
            raise ValueError(f"k must be in [1, {self.num_labels}], got {k}")
        n = x.shape[0]
        labels = np.empty((n, k), dtype=np.int32)
        scores = np.empty((n, k), dtype=np.float32)
        saved_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for a in range(0, n, batch_size):
                    rows = np.arange(a, min(n, a + batch_size))
                    ind, off, val = self._batch_tensors(x, rows)
                    z = self.model(ind, off, val)
                    p = torch.sigmoid(z) if self.binary else torch.softmax(z, dim=1)
                    s, l = torch.topk(p, k, dim=1)
                    labels[a:a + rows.size] = l.to("cpu").numpy()
                    scores[a:a + rows.size] = s.to("cpu").numpy()
        finally:
            self.model.train(was_training)
            torch.set_num_threads(saved_threads)
        return labels, scores

    def evaluate(self, data, k: Sequence[int] = (1, 3, 5)) -> Dict[str, float]:
        """:func:`slide.metrics.evaluate` of the top-``max(k)`` predictions on ``data``."""
        return evaluate_topk(self, data, k)

    def num_parameters(self) -> int:
        return int(sum(p.numel() for p in self.model.parameters()))
