"""Training curves of several runs on one figure: P@1 and loss against wall time.

Reads run folders (``metrics.jsonl``) and comparison folders or files
(``compare.json``, whose systems each carry a list of evaluation records).
Uses matplotlib's Agg backend, so it works without a display.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence, Tuple, Union

__all__ = ["load_curves", "plot_runs"]

Curve = Tuple[str, List[Dict[str, Any]]]


def _is_record_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(r, dict) and "seconds" in r for r in v)


def _curves_in_json(obj: Any, label: str) -> List[Curve]:
    """Every list of evaluation records inside a JSON document, named by where it sits.

    A compare.json names its systems (``systems: {name: {records: [...]}}``); other
    documents are searched for lists of objects that carry ``seconds``.
    """
    if isinstance(obj, dict) and isinstance(obj.get("systems"), dict):
        return [(name, s.get("records", [])) for name, s in obj["systems"].items()
                if isinstance(s, dict) and _is_record_list(s.get("records"))]
    found: List[Curve] = []
    if _is_record_list(obj):
        found.append((label, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k != "config":
                found.extend(_curves_in_json(v, f"{label}:{k}" if label else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.extend(_curves_in_json(v, f"{label}:{i}" if label else str(i)))
    return found


def _read_jsonl(path: str) -> List[Dict[str, Any]]:
    out = []
    with open(path, "r", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short by a crash
    return out


def load_curves(path: Union[str, os.PathLike]) -> List[Curve]:
    """``(label, records)`` pairs from a run folder, a compare folder or a JSON/JSONL file."""
    path = os.fspath(path)
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        found: List[Curve] = []
        metrics = os.path.join(path, "metrics.jsonl")
        if os.path.exists(metrics):
            found.append((name, _read_jsonl(metrics)))
        cmp = os.path.join(path, "compare.json")
        if os.path.exists(cmp):
            found.extend(load_curves(cmp))
        if not found:
            raise FileNotFoundError(f"{path}: no metrics.jsonl or compare.json in this folder")
        return found
    if not os.path.exists(path):
        raise FileNotFoundError(f"run folder or metrics file not found: {path}")
    if path.endswith(".jsonl"):
        return [(os.path.basename(os.path.dirname(os.path.abspath(path))), _read_jsonl(path))]
    with open(path, "r", encoding="utf-8") as fh:
        try:
            obj = json.load(fh)
        except ValueError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
    curves = _curves_in_json(obj, "")
    if not curves:
        raise ValueError(f"{path}: no evaluation records (lists of objects with 'seconds') found")
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return [(f"{parent}:{label}" if label else parent, recs) for label, recs in curves]


def _series(records: Sequence[Dict[str, Any]], key: str):
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if v is None:
            # records from a comparison may name the split: test/P@1
            v = next((r[k] for k in r if k.endswith("/" + key)), None)
        if v is not None and r.get("seconds") is not None:
            xs.append(float(r["seconds"]))
            ys.append(float(v))
    return xs, ys


def plot_runs(paths: Sequence[Union[str, os.PathLike]], output: Union[str, os.PathLike],
              metric: str = "P@1") -> str:
    """Draw ``metric`` and loss against wall time for every run in ``paths`` into ``output``."""
    curves: List[Curve] = []
    for p in paths:
        curves.extend(load_curves(p))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = os.fspath(output)
    fig, (ax_m, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = 0
    for label, recs in curves:
        xs, ys = _series(recs, metric)
        if xs:
            ax_m.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn += 1
        xs, ys = _series(recs, "loss")
        if xs:
            ax_l.plot(xs, ys, marker="o", markersize=3, label=label)
    if not drawn:
        plt.close(fig)
        raise ValueError(f"none of the runs has {metric} in its records")
    ax_m.set_xlabel("training wall time (s)")
    ax_m.set_ylabel(metric)
    ax_m.set_title(f"{metric} against wall time")
    ax_m.grid(alpha=0.3)
    ax_m.legend(fontsize="small")
    ax_l.set_xlabel("training wall time (s)")
    ax_l.set_ylabel("training loss")
    ax_l.set_title("loss against wall time")
    ax_l.grid(alpha=0.3)
    if ax_l.lines:
        ax_l.legend(fontsize="small")
    fig.tight_layout()
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output
