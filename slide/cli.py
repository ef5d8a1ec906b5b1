"""Command line: ``slide train | evaluate | predict | config | datasets | cache | plot | compare``.

The CLI only parses arguments, calls the Python API (``slide.Network``,
``slide.runs``, ``slide.datasets``, ...) and prints. User errors (bad config,
missing or malformed data, a model that would not fit in memory) exit with
status 2 and one message line; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

from ._util import format_bytes

EXIT_USER_ERROR = 2
EXIT_WRITE_FAILED = 74  # EX_IOERR: a file could not be written (disk full, size limit)
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A wrong combination of command-line arguments."""


# predict/evaluate --mode: slide.network.PREDICT_MODES, spelled out so that the parser does not
# import the engine (tests check that the two agree).
_PREDICT_MODES = ("exact", "index", "lsh")

def _user_error_types():
    from .config import ConfigError
    from .runs import RunFolderBusy

    # slide.DataError (malformed data), ConfigError and RunFormatError are ValueErrors; the
    # API raises ValueError only for bad input, never for its own faults.
    return (ConfigError, ValueError, FileNotFoundError, FileExistsError, MemoryError, UsageError, RunFolderBusy)


_RANK_PREFIX = ""   # "[rank r/R] " under mpiexec


def _eprint(*parts) -> None:
    print(_RANK_PREFIX + " ".join(str(p) for p in parts), file=sys.stderr, flush=True)


def _mpi_world():
    """MPI.COMM_WORLD under ``mpiexec -n R`` (R > 1), else None; sets the rank prefix of messages."""
    global _RANK_PREFIX
    from .distributed import world

    comm = world()
    if comm is not None:
        _RANK_PREFIX = f"[rank {comm.Get_rank()}/{comm.Get_size()}] "
    return comm


def _shared_run_dir(comm, make):
    """The run folder: rank 0 creates or opens it (with its lock), then the others open it."""
    from . import runs

    if comm is None:
        return make()
    run, error = None, None
    if comm.Get_rank() == 0:
        try:
            run = make()
        except Exception as e:  # the same error on every rank, not a rank left waiting
            error = e
    path = comm.bcast(run.path if run is not None else None, root=0)
    if comm.Get_rank() == 0 and error is not None:
        raise error
    if path is None:
        raise UsageError("rank 0 could not open the run folder (see its message)")
    return run if comm.Get_rank() == 0 else runs.RunDir(path)


def _parse_ks(text: str) -> List[int]:
    try:
        ks = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"-k expects positive integers like 1,3,5, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise UsageError(f"-k expects positive integers like 1,3,5, got {text!r}")
    return ks


_METRIC_KEY = re.compile(r"^(P|nDCG|PSP)@(\d+)$")


def _metric_line(rec: Dict) -> str:
    epoch = rec.get("epoch", "?")
    if isinstance(epoch, float):
        epoch = f"{epoch:g}" if epoch.is_integer() else f"{epoch:.2f}"
    head = ([rec["phase"]] if rec.get("phase") else []) + [f"epoch {epoch}", f"step {rec.get('step', '?')}"]
    if rec.get("seconds") is not None:
        head.append(f"{rec['seconds']:.1f}s")
    if rec.get("loss") is not None:
        head.append(f"loss {rec['loss']:.4f}")
    if rec.get("samples_per_second"):
        head.append(f"{rec['samples_per_second']:.0f} samples/s")
    order = {"P": 0, "nDCG": 1, "PSP": 2}
    shown = sorted((k for k in rec if _METRIC_KEY.match(k)),
                   key=lambda k: (order[_METRIC_KEY.match(k).group(1)], int(_METRIC_KEY.match(k).group(2))))
    if "test/P@1" in rec:
        if "valid/P@1" in rec:  # the unprefixed keys are the test set's
            shown.append("valid/P@1")
    elif "valid/P@1" in rec:    # validation only (none given, or training.test_every skipped it): say so
        shown = ["valid/" + k for k in shown]
    return "  ".join(head + [f"{k} {rec[k]:.4f}" for k in shown if rec[k] is not None])


def _metrics_table(metrics: Dict, ks: Sequence[int]) -> str:
    rows = []
    for name in ("P", "nDCG", "PSP", "PSnDCG", "R"):
        vals = [metrics.get(f"{name}@{k}") for k in ks]
        if any(v is not None for v in vals):
            rows.append(f"{name:>7}  " + "  ".join(f"@{k} {v:.4f}" for k, v in zip(ks, vals) if v is not None))
    return "\n".join(rows)


# ---------------------------------------------------------------------- train

def _default_config_path() -> str:
    from . import datasets

    return datasets.config_path("bibtex")


def _describe_network(net) -> str:
    """One line: the layer sizes, activations and the sampling each layer trains with
    (saying when ``sampling: auto`` chose it)."""
    # a built network's config has every size and sampling resolved
    layers = net.config.layers
    requested = net.requested_sampling or [None] * len(layers)
    parts = [f"network: {net.num_features} features"]
    for layer, asked in zip(layers, requested):
        how = f"{layer.sampling}, chosen by sampling: auto" if asked == "auto" else layer.sampling
        parts.append(f"{layer.size} {layer.activation} ({how})")
    return " -> ".join(parts)


# slide train: seconds between progress lines when stderr is not a terminal (a log file)
PROGRESS_LINE_SECONDS = 30.0


def _make_progress(quiet: bool):
    from .callbacks import ProgressBar

    class Progress(ProgressBar):
        """The library's bar on stderr (samples/s, loss, ETA), cleared at the end, or its lines
        where stderr is not a terminal; the network line and the metric lines go above it on
        stdout."""

        def __init__(self):
            super().__init__(file=sys.stderr, smoothing=0.1, leave=False, disable=quiet,
                             log_every=PROGRESS_LINE_SECONDS)
            self.described = False

        def on_train_begin(self, net):
            if not self.described:
                self.described = True
                self.write(_describe_network(net))
            super().on_train_begin(net)

        def write(self, line: str, file=None):
            if not quiet:
                super().write(line, file)

    return Progress()


@contextlib.contextmanager
def _phase_lines(progress, quiet: bool):
    """The library's INFO messages as lines above the progress bar while ``slide train`` runs:
    each learning rate searched, the refit starting, each network of an ensemble, the merge and
    the standardization vote. Those phases are most of a small set's run (scene: 20 of 25 s)
    and would pass without a line. Checkpoint writes are left out (the run folder lists them)."""
    if quiet:
        yield
        return
    logger = logging.getLogger("slide")

    class Lines(logging.Handler):
        def emit(self, record):
            if record.levelno == logging.INFO and not record.module == "callbacks":
                progress.write(record.getMessage())

    handler, level = Lines(logging.INFO), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def cmd_train(args) -> int:
    from . import runs
    from .config import Config

    comm = _mpi_world()
    rank = comm.Get_rank() if comm is not None else 0
    if rank != 0:
        args.quiet = True   # one progress bar and one set of result lines: rank 0's

    if args.resume:
        if args.config or args.set or args.out:
            raise UsageError("--resume takes the configuration from the run folder; "
                             "do not pass CONFIG, --set or --out with it")
        run = _shared_run_dir(comm, lambda: runs.RunDir.open(args.resume, for_writing=True))  # locked by rank 0
        config = run.config()
        runs.validate_config(config, source=run.config_path)
        if run.checkpoints.latest() is None:
            raise FileNotFoundError(f"{run.path}: no checkpoint to resume from")
        data = runs.load_run_data(config)
    else:
        path = args.config or _default_config_path()
        config = Config.from_yaml(path)
        if args.set:
            config = config.with_overrides(args.set)
        runs.absolute_data_paths(config)
        estimate = runs.validate_config(config, source=path)
        data = runs.load_run_data(config)
        if estimate is None:  # headerless file: check memory with the loaded shape
            from . import memory

            memory.check_fits(config, data[0].num_features, data[0].num_labels, num_points=len(data[0]))
        out = args.out or runs.default_run_dir(path)
        # Everything that can fail on user input has been checked: only now write
        # (under the folder's lock, which refuses a second process given the same --out).
        run = _shared_run_dir(comm, lambda: runs.RunDir.create(out, config))

    if comm is not None and config.training.threads == 0:
        # all cores by default, shared by the ranks on this machine
        from .distributed import local_ranks

        config.training.threads = max(1, (os.cpu_count() or 1) // local_ranks())
    args._run_dir = run.path  # for the resume hint after a failed write
    if not args.quiet:
        _eprint(f"run folder: {run.path}")
    progress = _make_progress(args.quiet)
    try:
        with _phase_lines(progress, args.quiet):
            summary = runs.train_run(config, run, resume=bool(args.resume), callbacks=[progress],
                                     on_record=lambda rec: progress.write(_metric_line(rec)), data=data,
                                     comm=comm, data_owned=True)
    except KeyboardInterrupt:
        # fit wrote a checkpoint of the interrupted state (on_train_end) before re-raising
        if getattr(args, "debug", False):
            raise
        _eprint(f"slide train: interrupted; continue with: slide train --resume {run.path}")
        return EXIT_INTERRUPTED
    if rank != 0:
        return 0
    if args.resume and summary.get("resumed_from_step") == summary.get("steps") and not args.quiet:
        _eprint(f"{run.path}: the run had finished; nothing more to train (evaluated and saved again)")
    ks = list(config.eval.k)
    print(f"final ({summary['evaluated_on']}): " + "  ".join(
        f"P@{k} {summary[f'P@{k}']:.4f}" for k in ks if f"P@{k}" in summary))
    sps = summary.get("samples_per_second")
    if summary.get("refit_epochs"):
        kept = (f"epochs auto: best validation {config.training.monitor} after {summary['best_epoch']} epochs, "
                f"refit on all of train for {summary['refit_epochs']}")
        tried = summary.get("lr_search") or []
        if len(tried) > 1:
            kept += (f"; lr {summary['lr']:g} of " + ", ".join(f"{t['lr']:g}" for t in tried)
                     + " by validation")
    else:
        kept = f"kept epoch {summary['kept_epoch']}"
    ens = summary.get("ensemble") or []
    if ens:
        kept += (f"; {len(ens)} networks merged (seeds " + ", ".join(str(m["seed"]) for m in ens)
                 + "; best epochs " + ", ".join("-" if m["best_epoch"] is None else f"{m['best_epoch']:g}" for m in ens)
                 + ")")
    if summary.get("centroid_weight"):
        how = " (by validation)" if summary.get("centroid_search") else ""
        ridge = (f" on ridge label vectors (lambda {summary['ridge_lambda']:g})"
                 if summary.get("centroid_kind") == "ridge" else
                 " on the networks' mixed label vectors" if summary.get("centroid_kind") == "mixed" else "")
        kept += f"; label-centroid weight {summary['centroid_weight']:g}{ridge}{how}"
    choice = summary.get("standardize_choice") or {}
    if choice:
        kept += ("; features " + ("standardized" if summary.get("standardized") else "not standardized")
                 + f" (by validation: P@1 summed over {len(choice['raw'])} networks "
                 + f"{sum(choice['standardized']):.4f} standardized, {sum(choice['raw']):.4f} without)")
    elif summary.get("standardized"):
        kept += "; features standardized (dense input)"
    ranks = summary.get("ranks", 1)
    rss = (f"peak RSS {format_bytes(summary['peak_rss_bytes'])}" if ranks == 1 else
           f"peak RSS per rank {' '.join(format_bytes(b) for b in summary['peak_rss_bytes_per_rank'])} "
           f"({ranks} ranks)")
    wall = (f" ({summary['wall_seconds']:.1f}s with evaluations and checkpoints)"
            if summary.get("wall_seconds") else "")
    print(f"train {summary['train_seconds']:.1f}s{wall}  " + (f"{sps:.0f} samples/s  " if sps else "")
          + f"{rss}  {kept}")
    print(f"saved {run.path}")
    return 0


# ---------------------------------------------------------------------- evaluate / predict

def _load_model_and_data(model: str, data: str, *, labels_needed: bool):
    """The network and the data file, refused when their shapes disagree.

    An XC header must declare the model's feature and label counts (for predict,
    0 labels is accepted: a file without labels); a libsvm file has no header, so
    its largest ids must fit the model.
    """
    from . import Network, runs
    from .data import Dataset, load_dataset

    model_path = runs.resolve_model(model)
    net = Network.load(model_path, comm=_mpi_world())   # a sharded model: one shard per rank, or merged
    if not os.path.exists(data):
        raise FileNotFoundError(f"data file not found: {data}")
    model_shape = f"the model {model_path} has {net.num_features} features and {net.num_labels} labels"
    header = runs.read_data_header(data) if os.path.isfile(data) else None
    if header is not None:
        _, nf, nl = header
        if nf != net.num_features or (nl != net.num_labels and (labels_needed or nl != 0)):
            raise UsageError(f"{data}: its header declares {nf} features and {nl} labels, but {model_shape}")
    ds = load_dataset(data)
    if header is None and (ds.num_features > net.num_features or ds.num_labels > net.num_labels):
        needs = []
        if ds.num_features > net.num_features:  # libsvm feature ids are 1-based
            needs.append(f"its largest feature id, {ds.num_features}, needs {ds.num_features} features")
        if ds.num_labels > net.num_labels:
            needs.append(f"its largest label id, {ds.num_labels - 1}, needs {ds.num_labels} labels")
        raise UsageError(f"{data}: (libsvm, no header) {' and '.join(needs)}, but {model_shape}")
    if (ds.num_features, ds.num_labels) != (net.num_features, net.num_labels):
        # a narrower libsvm file, or labels absent from a file to predict: widen to the model
        ds = Dataset(ds.features, ds.labels, num_features=net.num_features,
                     num_labels=net.num_labels)
    return net, ds


def cmd_evaluate(args) -> int:
    ks = _parse_ks(args.k)
    net, ds = _load_model_and_data(args.model, args.data, labels_needed=True)
    if len(ds) == 0:
        raise ValueError(f"{args.data} holds no data points")
    metrics = {k: float(v) for k, v in net.evaluate(ds, k=tuple(ks), mode=args.mode).items()}
    if net.rank != 0:
        return 0
    print(f"{args.data}: {len(ds)} points")
    print(_metrics_table(metrics, ks))
    if args.output:
        from .runs import atomic_write_text

        atomic_write_text(args.output, json.dumps(metrics, indent=2) + "\n")
    return 0


def cmd_predict(args) -> int:
    if args.k < 1:
        raise UsageError(f"-k must be a positive integer, got {args.k}")
    if args.batch < 1:
        raise UsageError(f"--batch must be a positive integer, got {args.batch}")
    net, ds = _load_model_and_data(args.model, args.data, labels_needed=False)
    if net.rank != 0:   # collective: every rank scores its labels, rank 0 writes
        for a in range(0, len(ds), args.batch):
            net.predict(ds[a:a + args.batch].features, k=args.k, mode=args.mode)
        return 0
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        # Batches keep memory flat and let a large test set stream to the file.
        for a in range(0, len(ds), args.batch):
            labels, scores = net.predict(ds[a:a + args.batch].features, k=args.k, mode=args.mode)
            lines = []
            for lab_row, sc_row in zip(labels.tolist(), scores.tolist()):
                lines.append(" ".join(f"{l}:{s:.6g}" for l, s in zip(lab_row, sc_row) if l >= 0))
            out.write("\n".join(lines) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


# ---------------------------------------------------------------------- config / datasets

def cmd_config(args) -> int:
    from . import runs
    from .config import Config, defaults_yaml

    if args.defaults:
        sys.stdout.write(defaults_yaml())
        return 0
    config = Config.from_yaml(args.check)
    estimate = runs.validate_config(config, source=args.check)
    if estimate is None and config.data.train:
        from . import memory
        from .data import load_dataset

        train = load_dataset(config.data.train, format=config.data.format, cache=config.data.cache)
        memory.check_fits(config, train.num_features, train.num_labels, num_points=len(train))
        estimate = memory.estimate(config, train.num_features, train.num_labels, num_points=len(train))
    print(f"OK {args.check}")
    if estimate:
        total = estimate.get("total")
        if total is not None:
            print(f"memory estimate: {format_bytes(total)}")
        for k, v in estimate.items():
            if k != "total" and isinstance(v, (int, float)):
                print(f"  {k}: {format_bytes(v)}")
    return 0


def cmd_datasets(args) -> int:
    from . import datasets

    if args.action == "list":
        rows = datasets.list_datasets()
        width = max((len(r["name"]) for r in rows), default=4)
        for r in rows:
            line = f"{r['name']:<{width}}  {r.get('kind') or '':<9}  {r.get('description') or ''}"
            print(line.rstrip())
        return 0
    if args.action == "stats":
        import numpy as np

        from .data import load_dataset

        if not os.path.exists(args.path):
            raise FileNotFoundError(f"data file not found: {args.path}")
        ds = load_dataset(args.path)
        st = ds.stats()
        counts = np.asarray(ds.label_counts())
        print(f"{args.path}")
        print(f"points {st['points']}  features {st['features']}  labels {st['labels']}")
        print(f"labels/point {st['avg_labels_per_point']:.2f} ({st['points_without_labels']} points without labels)")
        print(f"nnz/point {st['avg_nnz_per_point']:.2f}")
        if counts.size:
            print(f"points/label median {np.median(counts):.0f}  max {counts.max()}  "
                  f"labels never used {int((counts == 0).sum())}")
        return 0
    # synth
    paths = datasets.write_synthetic(args.preset, args.out, seed=args.seed)
    print(f"wrote synthetic '{args.preset}' (seed {args.seed}) to {args.out}")
    if isinstance(paths, (list, tuple)):
        for p in paths:
            print(f"  {p}")
    elif isinstance(paths, dict):
        for k, p in paths.items():
            print(f"  {k}: {p}")
    return 0


# ---------------------------------------------------------------------- cache

def cmd_cache(args) -> int:
    import time

    from . import data

    root = data.default_cache_dir()
    if args.action == "clear":
        n, size = data.clear_cache()
        print(f"removed {n} cache entr{'y' if n == 1 else 'ies'} ({format_bytes(size)}) from {root}")
        return 0
    entries = data.cache_entries()
    total = sum(e["bytes"] for e in entries)
    limit = data.cache_max_bytes()
    print(f"{root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {format_bytes(total)} "
          f"(cap {format_bytes(limit)}, SLIDE_CACHE_MAX_BYTES); least recently used first")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["last_used"]))
        if not e["complete"]:
            state = "incomplete"
        elif e.get("source_changed"):
            state = "stale (source changed or gone)"
        else:
            state = f"{e['points']} points"
        print(f"{format_bytes(e['bytes']):>10}  {when}  {e['source'] or os.path.basename(e['path'])}  {state}")
    return 0


# ---------------------------------------------------------------------- plot / compare

def cmd_plot(args) -> int:
    from .plot import plot_runs

    path = plot_runs(args.runs, args.output)
    print(f"wrote {path}")
    return 0


def cmd_compare(args) -> int:
    from . import runs
    from .config import Config

    config = Config.from_yaml(args.config)
    runs.validate_config(config, source=args.config)
    budget = runs.parse_duration(args.budget) if args.budget else None
    out = args.out or runs.default_run_dir(args.config, root=os.path.join("runs", "compare"))
    from .baselines.compare import run_compare

    try:
        # run_compare prints one line per evaluation (stderr) and the final table (stdout)
        run_compare(config, baseline=args.baseline, budget_seconds=budget, device=args.device,
                    out_dir=out, progress=True)
    except ImportError as e:
        msg = str(e)
        if "pip install" not in msg:
            msg = f"the {args.baseline} baseline is not installed ({msg}); install it with: " \
                  f"pip install 'slide[{args.baseline}]'"
        raise UsageError(msg) from None
    print(f"saved {os.path.join(out, 'compare.json')} and {os.path.join(out, 'compare.png')}")
    return 0


# ---------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback on errors")

    p = argparse.ArgumentParser(prog="slide", parents=[debug],
                                description="Sparse training for extreme multi-label classification.")
    from . import __version__

    p.add_argument("--version", action="version", version=f"slide {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser("train", parents=[debug], help="train a network from a YAML config",
                       description="Train from CONFIG (default: the bundled Bibtex config) into a run folder.")
    t.add_argument("config", nargs="?", metavar="CONFIG.yaml")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set training.epochs=3 (repeatable)")
    t.add_argument("--out", metavar="DIR", help="run folder (default runs/<config-name>-<timestamp>)")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar or per-evaluation lines")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", parents=[debug], help="metrics of a model on a data file")
    e.add_argument("model", metavar="MODEL", help="model file or run folder")
    e.add_argument("data", metavar="DATA")
    e.add_argument("-k", default="1,3,5", help="comma-separated k values (default 1,3,5)")
    e.add_argument("-o", "--output", metavar="FILE", help="also write the metrics as JSON")
    e.add_argument("--mode", choices=_PREDICT_MODES, default="exact",
                   help="exact: score every label (default); index: the labels of the best clusters of an "
                        "inference index built from the output layer at load (sublinear, approximate); lsh: "
                        "only the candidates of the training hash tables")
    e.set_defaults(func=cmd_evaluate)

    pr = sub.add_parser("predict", parents=[debug], help="top-k labels per point",
                        description="One line per point: label:score pairs, best first.")
    pr.add_argument("model", metavar="MODEL", help="model file or run folder")
    pr.add_argument("data", metavar="DATA")
    pr.add_argument("-k", type=int, default=5, help="labels per point (default 5)")
    pr.add_argument("-o", "--output", metavar="FILE", help="output file (default stdout)")
    pr.add_argument("--batch", type=int, default=4096, help="points predicted at a time (default 4096)")
    pr.add_argument("--mode", choices=_PREDICT_MODES, default="exact",
                    help="exact: score every label (default); index: the labels of the best clusters of an "
                         "inference index built from the output layer at load (sublinear, approximate); lsh: "
                         "only the hash-selected candidates of a hash-sampled output layer (sublinear, approximate)")
    pr.set_defaults(func=cmd_predict)

    c = sub.add_parser("config", parents=[debug], help="print the defaults or check a config")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--defaults", action="store_true", help="print every key with its default and meaning")
    g.add_argument("--check", metavar="CONFIG", help="validate CONFIG and its data files; print a memory estimate")
    c.set_defaults(func=cmd_config)

    d = sub.add_parser("datasets", parents=[debug], help="list, inspect or generate datasets")
    dsub = d.add_subparsers(dest="action", metavar="ACTION")
    dsub.required = True
    dsub.add_parser("list", parents=[debug], help="bundled datasets and synthetic presets")
    st = dsub.add_parser("stats", parents=[debug], help="statistics of a data file")
    st.add_argument("path", metavar="PATH")
    sy = dsub.add_parser("synth", parents=[debug], help="write a synthetic dataset")
    sy.add_argument("preset", metavar="PRESET")
    sy.add_argument("--out", required=True, metavar="DIR")
    sy.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_datasets)

    ca = sub.add_parser("cache", parents=[debug], help="list or clear the parsed-data cache",
                        description="The cache of parsed data files ($SLIDE_CACHE_DIR, default ~/.cache/slide), "
                                    "capped at $SLIDE_CACHE_MAX_BYTES (default 2 GiB, least recently used "
                                    "entries evicted first).")
    casub = ca.add_subparsers(dest="action", metavar="ACTION")
    casub.required = True
    casub.add_parser("list", parents=[debug], help="entries, their size, last use and source file")
    casub.add_parser("clear", parents=[debug], help="remove every entry")
    ca.set_defaults(func=cmd_cache)

    pl = sub.add_parser("plot", parents=[debug], help="P@1 and loss against wall time for runs")
    pl.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or compare folders)")
    pl.add_argument("-o", "--output", required=True, metavar="FILE.png")
    pl.set_defaults(func=cmd_plot)

    cp = sub.add_parser("compare", parents=[debug], help="time-to-accuracy against a baseline (dense torch, PECOS, napkinXC)")
    cp.add_argument("config", metavar="CONFIG")
    cp.add_argument("--baseline", choices=("torch", "pecos", "napkinxc"), default="torch")
    cp.add_argument("--budget", metavar="TIME", help="wall-time budget per system, e.g. 90s, 10m, 1h")
    cp.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    cp.add_argument("--out", metavar="DIR")
    cp.set_defaults(func=cmd_compare)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        code = _main(argv)
    except Exception:
        if not _RANK_PREFIX:
            raise
        import traceback

        traceback.print_exc()
        code = 1
    if code != 0 and _RANK_PREFIX:
        # Under mpiexec a rank that fails must not leave its peers waiting in a collective:
        # end the whole job (after this rank's message).
        from mpi4py import MPI

        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(code)
    return code


def _main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        hint = ""
        if getattr(args, "command", None) == "train":
            hint = " (continue with: slide train --resume RUN_DIR)"
        _eprint(f"slide: interrupted{hint}")
        return EXIT_INTERRUPTED
    except _user_error_types() as e:
        if debug:
            raise
        msg = str(e) or type(e).__name__
        if isinstance(e, MemoryError) and "memory" not in msg.lower():
            msg = f"not enough memory: {msg}"
        _eprint(f"slide {args.command}: error: {msg}")
        return EXIT_USER_ERROR
    except BrokenPipeError:
        # `slide predict ... | head`: the reader left; not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:
        # Disk full, file size limit, permissions: one line naming the file and the cause.
        # What was complete before (checkpoints, the model) is intact (slide.runs).
        if debug:
            raise
        from .runs import RunDir, RunWriteError

        if isinstance(e, RunWriteError):
            msg = str(e)
        else:
            where = f"{e.filename}: " if e.filename else ""
            msg = f"{where}{e.strerror or e}"
        hint = ""
        if getattr(args, "command", None) == "train":
            run_dir = getattr(args, "resume", None) or getattr(args, "_run_dir", None)
            if run_dir and RunDir(run_dir).checkpoints.latest() is not None:
                hint = f"; once there is room, continue with: slide train --resume {run_dir}"
        _eprint(f"slide {args.command}: error: {msg}{hint}")
        return EXIT_WRITE_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
