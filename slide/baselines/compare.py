"""Time-to-accuracy comparison of slide against a baseline on the same data (``slide compare``).

:func:`run_compare` trains, one after the other, the slide network of a configuration and a
baseline (the dense PyTorch network of the same architecture, PECOS XR-Linear or a napkinXC
probabilistic label tree), on the same
training file, and evaluates both with the same :mod:`slide.metrics` code on the same test points
at the same training-time marks. Each system runs in its own fresh process (``isolate=True``), so
its peak memory is its own and neither warms caches for the other.

Clock: ``seconds`` is training wall time. The clock starts when the first batch starts (data
loading and model set-up excluded) and pauses while the test set is evaluated, for both systems
alike, so a mark compares the same amount of training. Evaluations happen at the first batch
boundary past each mark. PECOS and napkinXC train in one call: they have a single record, at
the end.

Outputs, in ``out_dir``: ``compare.json`` (keys below), ``compare.png`` (test P@1 against
training time for both systems) and the text table that is also returned under ``"table"``.

``compare.json`` / the returned dict::

    version          1
    baseline         "torch" | "pecos" | "napkinxc"
    budget_seconds   training-time budget of each system
    marks            training-time marks (seconds) at which test metrics were taken
    device           device the baseline ran on ("cpu", "cuda", ...)
    dataset          {"name", "train", "test", "train_points", "test_points", "eval_points",
                      "num_features", "num_labels"}
    config           the resolved slide configuration (dict)
    systems          {"slide": S, "<baseline>": S}, each S = {
                        "name", "records": [per evaluation: "mark", "step", "epoch", "seconds",
                                           "samples", "samples_per_second", "loss", "P@1", "P@3",
                                           "P@5", "nDCG@k", "PSP@k", ...],
                        "summary": {"train_seconds", "samples", "samples_per_second",
                                    "best_P@1", "best_P@1_seconds", "final": {metrics},
                                    "peak_rss_bytes", "rss_growth_bytes", "threads", ...},
                        "error": message (only when the system failed)}
    comparison       {"target_P@1": the baseline's best P@1,
                      "slide_seconds_to_target": first time slide reached it (null: not reached),
                      "baseline_seconds_to_target": when the baseline reached its best,
                      "time_to_target_speedup": baseline / slide seconds (null if not reached),
                      "samples_per_second_ratio": slide / baseline,
                      "peak_rss_ratio": slide / baseline,
                      "p_at_1_at_marks": [{"mark", "slide", "<baseline>"}...]}
    table            the text table
    plot             path of compare.png
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from .._util import format_bytes, jsonable, peak_rss_bytes
from ..config import Config, ConfigError

__all__ = ["run_compare", "default_marks", "format_table", "BASELINES", "ONE_CALL"]

BASELINES = ("torch", "pecos", "napkinxc")
#: Baselines that train in one call to completion: one record, no training throughput.
ONE_CALL = ("pecos", "napkinxc")

#: Fractions of the budget at which test metrics are taken by default.
_MARK_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def default_marks(budget_seconds: float) -> List[float]:
    """Training-time marks for a budget: dense early (where curves move), then every 10%."""
    return [round(budget_seconds * f, 3) for f in _MARK_FRACTIONS]


# ====================================================================== per-process measurement

class _RssSampler:
    """Peak resident memory of this process, sampled by a background thread.

    ``growth`` is the peak minus the RSS when sampling started, i.e. what training added on top
    of the loaded data and the imported libraries.
    """

    def __init__(self, interval: float = 0.02):
        import psutil
        self._proc = psutil.Process()
        self.interval = interval
        self.start_rss = self._proc.memory_info().rss
        self.peak = self.start_rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slide-rss-sampler", daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                rss = self._proc.memory_info().rss
            except Exception:  # process state unreadable for an instant: skip a sample
                continue
            if rss > self.peak:
                self.peak = rss

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        rss = self._proc.memory_info().rss
        self.peak = max(self.peak, rss)
        return False

    @property
    def growth(self) -> int:
        return int(self.peak - self.start_rss)


class _MarkClock:
    """Training clock with pauses for evaluation, and the marks still to be taken."""

    def __init__(self, marks: Sequence[float], budget: float):
        self.marks = sorted(float(m) for m in marks if m <= budget + 1e-9)
        self.budget = float(budget)
        self.next = 0
        self.t0 = None
        self.paused = 0.0

    def start(self):
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def due(self, elapsed: float) -> Optional[float]:
        """The latest mark passed (consumes all passed marks), or None."""
        mark = None
        while self.next < len(self.marks) and elapsed >= self.marks[self.next]:
            mark = self.marks[self.next]
            self.next += 1
        return mark


def _metrics(top, labels, ks, props) -> Dict[str, float]:
    from .. import metrics
    return {k: float(v) for k, v in metrics.evaluate(top, labels, k=tuple(ks), propensities=props).items()}


def _load(path: str, fmt: str, cache: bool):
    from .. import data
    if path.endswith(".npz"):
        import scipy.sparse as sp
        with np.load(path) as z:
            x = sp.csr_matrix((z["x_data"], z["x_indices"], z["x_indptr"]), shape=tuple(z["x_shape"]))
            y = sp.csr_matrix((z["y_data"], z["y_indices"], z["y_indptr"]), shape=tuple(z["y_shape"]))
        return data.Dataset(x, y)
    return data.load_dataset(path, format=fmt, cache=cache)


def _save_npz(ds, path: str) -> None:
    import scipy.sparse as sp
    x = sp.csr_matrix(ds.features)
    y = sp.csr_matrix(ds.labels)
    np.savez(path, x_data=x.data, x_indices=x.indices, x_indptr=x.indptr, x_shape=np.array(x.shape),
             y_data=y.data, y_indices=y.indices, y_indptr=y.indptr, y_shape=np.array(y.shape))


def _default_threads() -> int:
    from .. import _core
    return int(_core.default_threads())


def _eval_rows(n: int, eval_samples: int, seed: int) -> Optional[np.ndarray]:
    if not eval_samples or eval_samples >= n:
        return None
    return np.sort(np.random.default_rng([seed, 0xC0A7]).choice(n, eval_samples, replace=False))


# ====================================================================== the systems

def _run_slide(config: Config, train, test_x, test_y, props, clock: _MarkClock, ks,
               log) -> Dict[str, Any]:
    from ..network import Network

    cfg = config.copy()
    cfg.training.epochs = 10 ** 9           # the time budget stops training, not the epochs
    cfg.training.eval_every = 0
    cfg.training.patience = 0
    cfg.data.valid_fraction = 0.0
    cfg.training.restore_best = False
    net = Network(cfg)
    records: List[Dict[str, Any]] = []
    state = {"samples": 0, "loss_sum": 0.0, "loss_n": 0, "last_samples": 0, "last_time": 0.0}
    bs = cfg.training.batch_size

    def evaluate(net, mark, elapsed):
        te = time.perf_counter()
        top, _ = net.predict(test_x, k=max(ks))
        rec = {"mark": mark, "step": int(net.step), "epoch": int(net.epoch), "seconds": elapsed,
               "samples": state["samples"],
               "samples_per_second": ((state["samples"] - state["last_samples"])
                                      / max(elapsed - state["last_time"], 1e-9)),
               "loss": state["loss_sum"] / max(state["loss_n"], 1)}
        rec.update(_metrics(top, test_y, ks, props))
        records.append(rec)
        state.update(loss_sum=0.0, loss_n=0, last_samples=state["samples"], last_time=elapsed)
        log(f"slide  {elapsed:8.1f}s  P@1 {rec['P@1']:.4f}  loss {rec['loss']:.4f}")
        clock.paused += time.perf_counter() - te

    class _Marks:
        def on_train_begin(self, net):
            clock.start()

        def on_batch_end(self, net, step, loss):
            state["samples"] += getattr(net, "_last_batch_size", 0) or bs
            state["loss_sum"] += float(loss)
            state["loss_n"] += 1
            elapsed = clock.elapsed()
            mark = clock.due(elapsed)
            over = elapsed >= clock.budget
            if mark is not None or over:
                evaluate(net, mark if mark is not None else clock.budget, elapsed)
            if over:
                net.stop_training = True

    net.fit(train, callbacks=[_Marks()], progress=False)
    elapsed = clock.elapsed()
    if not records or records[-1]["step"] != net.step:
        evaluate(net, clock.budget, elapsed)
    return {"records": records, "train_seconds": elapsed, "samples": state["samples"],
            "threads": cfg.training.threads or _default_threads(),
            "sampling": getattr(net, "resolved_sampling", None)}


def _run_torch(config: Config, train, test_x, test_y, props, clock: _MarkClock, ks, device,
               log) -> Dict[str, Any]:
    from .torch_dense import TorchDenseTrainer

    t = TorchDenseTrainer(config, max(train.num_features, test_x.shape[1]), test_y.shape[1], device=device)
    records: List[Dict[str, Any]] = []

    # The trainer owns the clock and pauses it while it evaluates; this only names the mark.
    def on_eval(trainer, rec):
        mark = clock.due(rec["seconds"])
        rec["mark"] = mark if mark is not None else clock.budget
        records.append(rec)
        log(f"{'torch':6} {rec['seconds']:8.1f}s  P@1 {rec['P@1']:.4f}  loss {rec['loss']:.4f}")

    clock.start()
    t.fit_for(train, seconds=clock.budget, test=(test_x, test_y), eval_at=clock.marks,
              k=ks, callback=on_eval, propensities=props)
    return {"records": records, "train_seconds": t.train_seconds, "samples": t.samples_seen,
            "threads": t.threads, "device": t.device, "optimizer": t.optimizer_impl,
            "parameters": t.num_parameters()}


def _run_one_call(name: str, model, train, test_x, test_y, props, clock: _MarkClock, ks,
                  log) -> Dict[str, Any]:
    """A baseline that trains in one call to completion (``model.fit``), measured once at the end."""
    clock.start()
    model.fit(train)
    elapsed = clock.elapsed()
    top, _ = model.predict_topk(test_x, max(ks))
    rec = {"mark": None, "step": 1, "epoch": 1, "seconds": elapsed, "samples": len(train),
           "samples_per_second": len(train) / max(elapsed, 1e-9), "loss": None}
    rec.update(_metrics(top, test_y, ks, props))
    log(f"{name:6} {elapsed:8.1f}s  P@1 {rec['P@1']:.4f}")
    return {"records": [rec], "train_seconds": elapsed, "samples": len(train),
            "threads": model.threads, "params": model.params_summary()}


def _run_pecos(config: Config, train, test_x, test_y, props, clock: _MarkClock, ks,
               log) -> Dict[str, Any]:
    from .pecos_linear import PecosXLinear

    return _run_one_call("pecos", PecosXLinear(config), train, test_x, test_y, props, clock, ks, log)


def _run_napkinxc(config: Config, train, test_x, test_y, props, clock: _MarkClock, ks,
                  log) -> Dict[str, Any]:
    from .napkinxc_plt import NapkinPLT

    with NapkinPLT(config) as model:
        return _run_one_call("napkinxc", model, train, test_x, test_y, props, clock, ks, log)


def _system_main(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run one system as described by ``spec`` (JSON-able) and return its result."""
    from .. import metrics

    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if spec["progress"] else (lambda msg: None)
    config = Config.from_dict(spec["config"])
    train = _load(spec["train"], config.data.format, config.data.cache)
    test = _load(spec["test"], config.data.format, config.data.cache)
    rows = _eval_rows(len(test), spec["eval_samples"], config.training.seed)
    test_x, test_y = test.features, test.labels
    if rows is not None:
        test_x, test_y = test_x[rows], test_y[rows]
    num_labels = max(train.num_labels, test.num_labels)
    if test_y.shape[1] < num_labels:
        import scipy.sparse as sp
        test_y = sp.csr_matrix((test_y.data, test_y.indices, test_y.indptr), shape=(test_y.shape[0], num_labels))
    counts = np.bincount(train.labels.indices, minlength=num_labels)
    props = metrics.propensities(counts, config.eval.propensity_a, config.eval.propensity_b,
                                 num_points=len(train))
    ks = list(config.eval.k)
    clock = _MarkClock(spec["marks"], spec["budget"])
    # Import the system's libraries before sampling starts: their code and static data are
    # not memory that training uses.
    if spec["system"] == "torch":
        from . import torch_dense
        torch_dense.import_torch()
    elif spec["system"] == "pecos":
        from . import pecos_linear
        pecos_linear.import_pecos()
    elif spec["system"] == "napkinxc":
        from . import napkinxc_plt
        napkinxc_plt.import_napkinxc()
    with _RssSampler() as rss:
        system = spec["system"]
        if system == "slide":
            out = _run_slide(config, train, test_x, test_y, props, clock, ks, log)
        elif system == "torch":
            out = _run_torch(config, train, test_x, test_y, props, clock, ks, spec["device"], log)
        elif system == "pecos":
            out = _run_pecos(config, train, test_x, test_y, props, clock, ks, log)
        elif system == "napkinxc":
            out = _run_napkinxc(config, train, test_x, test_y, props, clock, ks, log)
        else:
            raise ValueError(f"unknown system {system!r}")
    out["peak_rss_bytes"] = max(rss.peak, peak_rss_bytes())
    out["rss_growth_bytes"] = rss.growth
    out["rss_before_bytes"] = int(rss.start_rss)
    return out


def _worker_main(argv: Sequence[str]) -> int:
    """``python -m slide.baselines.compare SPEC.json RESULT.json``: run one system in a fresh process."""
    spec_path, result_path = argv
    with open(spec_path, "r", encoding="utf-8") as fh:
        spec = json.load(fh)
    try:
        out: Dict[str, Any] = {"status": "ok", "result": _system_main(spec)}
    except KeyboardInterrupt:
        return 130
    except BaseException as e:  # reported to the parent, which records the failure
        out = {"status": "error", "error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"}
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump(jsonable(out), fh)
    return 0


def _run_isolated(spec: Dict[str, Any], tmp: str) -> Dict[str, Any]:
    """Run one system in a new interpreter (a subprocess, not a fork: clean memory and threads,
    and no re-import of the caller's ``__main__``)."""
    import subprocess

    spec_path = os.path.join(tmp, f"{spec['system']}.spec.json")
    result_path = os.path.join(tmp, f"{spec['system']}.result.json")
    with open(spec_path, "w", encoding="utf-8") as fh:
        json.dump(spec, fh)
    # PYTHONSAFEPATH (Python 3.11+): the worker must import the slide this process imported, not
    # a source checkout that happens to be the working directory (it has no compiled engine).
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.Popen([sys.executable, "-m", "slide.baselines.compare", spec_path, result_path], env=env,
                            stdout=None if spec["progress"] else subprocess.DEVNULL,
                            stderr=None if spec["progress"] else subprocess.PIPE)
    try:
        _, err = proc.communicate()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    if os.path.exists(result_path):
        with open(result_path, "r", encoding="utf-8") as fh:
            out = json.load(fh)
        if out.get("status") == "ok":
            return out["result"]
        return {"error": out.get("error", "unknown error")}
    how = (f"was killed by signal {-proc.returncode}" + (" (out of memory?)" if proc.returncode == -9 else "")
           if proc.returncode < 0 else f"exited with code {proc.returncode}")
    tail = err.decode("utf-8", "replace").strip().splitlines()[-5:] if err else []
    return {"error": f"the {spec['system']} process {how} before reporting"
                     + ("\n" + "\n".join(tail) if tail else "")}


# ====================================================================== summary and table

def _summary(result: Dict[str, Any]) -> Dict[str, Any]:
    recs = result.get("records") or []
    s = {k: v for k, v in result.items() if k != "records"}
    if recs:
        best = max(recs, key=lambda r: r["P@1"])
        s["best_P@1"] = best["P@1"]
        s["best_P@1_seconds"] = best["seconds"]
        s["final"] = {k: v for k, v in recs[-1].items() if "@" in k}
    secs = result.get("train_seconds") or 0.0
    s["samples_per_second"] = result.get("samples", 0) / secs if secs > 0 else None
    return s


def _first_reaching(recs: List[Dict[str, Any]], target: float) -> Optional[float]:
    for r in recs:
        if r["P@1"] >= target - 1e-12:
            return r["seconds"]
    return None


def _ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def _compare(systems: Dict[str, Dict[str, Any]], baseline: str, marks: Sequence[float]) -> Dict[str, Any]:
    sl, bl = systems.get("slide", {}), systems.get(baseline, {})
    s_sum, b_sum = sl.get("summary", {}), bl.get("summary", {})
    target = b_sum.get("best_P@1")
    c: Dict[str, Any] = {"target_P@1": target}
    c["slide_seconds_to_target"] = (_first_reaching(sl.get("records", []), target)
                                    if target is not None else None)
    c["baseline_seconds_to_target"] = b_sum.get("best_P@1_seconds")
    c["time_to_target_speedup"] = _ratio(c["baseline_seconds_to_target"], c["slide_seconds_to_target"])
    # PECOS and napkinXC are not trained by passes of batches: their "samples/s" (training points
    # over training time) is not a throughput that a ratio with slide's would mean anything for.
    c["samples_per_second_ratio"] = (None if baseline in ONE_CALL else
                                     _ratio(s_sum.get("samples_per_second"), b_sum.get("samples_per_second")))
    c["peak_rss_ratio"] = _ratio(s_sum.get("peak_rss_bytes"), b_sum.get("peak_rss_bytes"))
    rows = []
    for m in marks:
        row = {"mark": m}
        for name in ("slide", baseline):
            r = [x for x in systems.get(name, {}).get("records", []) if x.get("mark") == m]
            row[name] = r[0]["P@1"] if r else None
        rows.append(row)
    c["p_at_1_at_marks"] = rows
    return c


def _fmt(v, spec=".4f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def format_table(result: Dict[str, Any]) -> str:
    """The comparison as a plain-text table (what ``slide compare`` prints)."""
    baseline = result["baseline"]
    names = ["slide", baseline]
    systems = result["systems"]
    ks = [k for k in ("P@1", "P@3", "P@5")]
    ds = result.get("dataset", {})
    lines = [f"slide vs {baseline} on {ds.get('name', '?')} "
             f"({ds.get('train_points', '?')} train / {ds.get('eval_points', '?')} test points, "
             f"{ds.get('num_features', '?')} features, {ds.get('num_labels', '?')} labels), "
             f"budget {result['budget_seconds']:g}s of training each, baseline on {result.get('device')}"]
    lines.append("")
    head = f"{'train s':>8} | " + " | ".join(f"{n:^26}" for n in names)
    sub = f"{'(mark)':>8} | " + " | ".join(" ".join(f"{k:>8}" for k in ks) for _ in names)
    lines += [head, sub, "-" * len(sub)]
    for m in result["marks"]:
        cells = []
        for n in names:
            r = [x for x in systems.get(n, {}).get("records", []) if x.get("mark") == m]
            cells.append(" ".join(f"{_fmt(r[0].get(k)) if r else '-':>8}" for k in ks))
        lines.append(f"{m:>8g} | " + " | ".join(cells))
    if baseline in ONE_CALL:
        r = systems.get(baseline, {}).get("records", [])
        if r:
            lines.append(f"{baseline} trains in one call: {r[0]['seconds']:.1f}s, "
                         + " ".join(f"{k} {_fmt(r[0].get(k))}" for k in ks))
    lines.append("")
    lines.append(f"{'':24} {'slide':>14} {baseline:>14} {'slide/' + baseline:>14}")
    s = {n: systems.get(n, {}).get("summary", {}) for n in names}

    def row(label, key, f=lambda v: _fmt(v, ".1f"), ratio=True):
        a, b = s["slide"].get(key), s[baseline].get(key)
        r = _ratio(a, b) if ratio else None
        lines.append(f"{label:24} {f(a):>14} {f(b):>14} {_fmt(r, '.2f') if ratio else '':>14}")

    row("samples/s", "samples_per_second", ratio=baseline not in ONE_CALL)
    row("train seconds", "train_seconds")
    row("best P@1", "best_P@1", f=_fmt, ratio=False)
    row("peak RSS", "peak_rss_bytes", f=format_bytes)
    row("RSS growth in training", "rss_growth_bytes", f=format_bytes)
    c = result["comparison"]
    if c.get("target_P@1") is not None:
        t = c.get("slide_seconds_to_target")
        lines.append(f"time to the {baseline}'s best P@1 {c['target_P@1']:.4f}: slide "
                     + (f"{t:.1f}s" if t is not None else "not reached")
                     + f", {baseline} {_fmt(c.get('baseline_seconds_to_target'), '.1f')}s"
                     + (f" (speed-up {c['time_to_target_speedup']:.2f}x)"
                        if c.get("time_to_target_speedup") else ""))
    for n in names:
        if "error" in systems.get(n, {}):
            lines.append(f"{n} FAILED: {systems[n]['error'].splitlines()[0]}")
    return "\n".join(lines)


def _plot(result: Dict[str, Any], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for name, sysres in result["systems"].items():
            recs = sysres.get("records") or []
            if not recs:
                continue
            xs = [r["seconds"] for r in recs]
            ys = [r["P@1"] for r in recs]
            ax.plot(xs, ys, marker="o", ms=3, label=name)
        target = result["comparison"].get("target_P@1")
        if target is not None:
            ax.axhline(target, ls="--", lw=0.8, color="gray", label=f"{result['baseline']} best P@1")
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel("test P@1")
        ax.set_title(f"{result.get('dataset', {}).get('name', '')}: slide vs {result['baseline']}")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


# ====================================================================== entry point

def run_compare(config: Union[Config, Dict[str, Any], str, os.PathLike],
                baseline: str = "torch",
                budget_seconds: Optional[float] = 600,
                device: str = "auto",
                out_dir: Union[str, os.PathLike] = "runs/compare",
                marks: Optional[Sequence[float]] = None,
                progress: bool = True,
                *,
                train=None,
                test=None,
                eval_samples: Optional[int] = None,
                isolate: bool = True,
                dataset_name: Optional[str] = None) -> Dict[str, Any]:
    """Train slide and a baseline on the same data for the same time; compare their curves.

    Parameters
    ----------
    config:
        a :class:`slide.Config`, dict or YAML path. ``data.train`` and ``data.test`` name the data
        (unless ``train``/``test`` are given); architecture, batch size, learning rate, seed and
        ``training.threads`` apply to both systems.
    baseline:
        ``"torch"`` (dense PyTorch network of the same architecture; needs ``slide[torch]``),
        ``"pecos"`` (PECOS XR-Linear, trained once to completion; needs ``slide[pecos]``) or
        ``"napkinxc"`` (napkinXC PLT, trained once to completion; needs ``slide[napkinxc]``).
    budget_seconds:
        training time of each system (``None``: 600).
    device:
        where the torch baseline runs: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when usable).
        slide always runs on the CPU.
    out_dir:
        folder for ``compare.json`` and ``compare.png`` (created).
    marks:
        training-time marks (seconds) at which test metrics are taken; default
        :func:`default_marks` of the budget.
    progress:
        write a line per evaluation to stderr and the final table to stdout (the library is
        otherwise silent).
    train, test:
        :class:`slide.Dataset` objects to use instead of the configured files.
    eval_samples:
        evaluate on a fixed seeded subset of this many test points (0 = all), the same for
        both systems; ``None`` takes ``training.eval_samples`` of the configuration.
    isolate:
        run each system in its own process (clean peak memory, no shared warm-up). ``False``
        runs both in this process; peak memory is then only the growth during each run.
    dataset_name:
        name shown in the table (default: the training file's folder name).

    Returns the dict written to ``compare.json`` (see the module documentation for its keys).
    Raises ``ConfigError``/``FileNotFoundError`` for a bad configuration before any training,
    and ``ImportError`` when the baseline's package is missing. A system that fails while
    training is recorded under ``systems[name]["error"]`` and the other still runs.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}; got {baseline!r}")
    budget = 600.0 if budget_seconds is None else float(budget_seconds)
    if not budget > 0 or math.isinf(budget):
        raise ValueError(f"budget_seconds must be a positive number of seconds, got {budget_seconds!r}")
    cfg = Config.load(config)
    if eval_samples is None:
        eval_samples = cfg.training.eval_samples
    if eval_samples < 0:
        raise ValueError(f"eval_samples must be >= 0, got {eval_samples}")
    if (train is None) != (test is None):
        raise ValueError("give both train and test datasets, or neither (to use data.train/test)")
    if train is None:
        if not cfg.data.train or not cfg.data.test:
            raise ConfigError("compare needs data.train and data.test in the configuration "
                              "(the test set is what both systems are measured on)")
        cfg.check_files(source="compare")
    mk = sorted(set(float(m) for m in (marks if marks is not None else default_marks(budget))))
    if not mk or mk[0] <= 0:
        raise ValueError(f"marks must be positive seconds, got {marks!r}")
    mk = [m for m in mk if m <= budget + 1e-9]

    # Fail before any training when the baseline cannot run.
    if baseline == "torch":
        from .torch_dense import require_torch, resolve_device
        require_torch()
        # "cpu" needs no torch import here (it takes seconds); other devices are checked now.
        dev = "cpu" if device == "cpu" else resolve_device(device)
    elif baseline == "pecos":
        from .pecos_linear import import_pecos
        import_pecos()
        dev = "cpu"
    else:
        from .napkinxc_plt import import_napkinxc
        import_napkinxc()
        dev = "cpu"

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="slide-compare-") as tmp:
        if train is not None:
            train_path, test_path = os.path.join(tmp, "train.npz"), os.path.join(tmp, "test.npz")
            _save_npz(train, train_path)
            _save_npz(test, test_path)
            n_train, n_test = len(train), len(test)
            nf = max(train.num_features, test.num_features)
            nl = max(train.num_labels, test.num_labels)
            name = dataset_name or "in-memory data"
            shown_train = shown_test = None
        else:
            train_path, test_path = cfg.data.train, cfg.data.test
            from ..runs import read_data_header
            h_tr, h_te = read_data_header(train_path), read_data_header(test_path)
            n_train = h_tr[0] if h_tr else None
            n_test = h_te[0] if h_te else None
            nf = max(h_tr[1], h_te[1]) if h_tr and h_te else None
            nl = max(h_tr[2], h_te[2]) if h_tr and h_te else None
            name = dataset_name or os.path.basename(os.path.dirname(os.path.abspath(train_path)))
            shown_train, shown_test = train_path, test_path

        base_spec = {"config": cfg.to_dict(), "train": train_path, "test": test_path, "budget": budget,
                     "marks": mk, "eval_samples": int(eval_samples), "progress": bool(progress),
                     "device": dev}
        systems: Dict[str, Dict[str, Any]] = {}
        for system in ("slide", baseline):
            spec = dict(base_spec, system=system)
            if isolate:
                res = _run_isolated(spec, tmp)
            else:
                try:
                    res = _system_main(spec)
                except (KeyboardInterrupt, MemoryError):
                    raise
                except Exception as e:
                    res = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"}
            entry: Dict[str, Any] = {"name": system, "records": res.get("records", [])}
            if "error" in res:
                entry["error"] = res["error"]
                if progress:
                    print(f"{system} failed: {res['error']}", file=sys.stderr, flush=True)
            else:
                entry["summary"] = _summary(res)
            systems[system] = entry

    result: Dict[str, Any] = {
        "version": 1,
        "baseline": baseline,
        "budget_seconds": budget,
        "marks": mk,
        "device": dev,
        "dataset": {"name": name, "train": shown_train, "test": shown_test, "train_points": n_train,
                    "test_points": n_test,
                    "eval_points": min(n_test, eval_samples) if (eval_samples and n_test) else n_test,
                    "num_features": nf, "num_labels": nl},
        "config": cfg.to_dict(),
        "systems": systems,
    }
    result["comparison"] = _compare(systems, baseline, mk)
    result["table"] = format_table(result)
    result["plot"] = _plot(result, os.path.join(out_dir, "compare.png"))
    result = jsonable(result)
    from ..runs import atomic_write_text
    atomic_write_text(os.path.join(out_dir, "compare.json"), json.dumps(result, indent=1))
    if progress:
        print(result["table"], flush=True)
    return result


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
