"""Bundled data sets, dataset cards, training configs and the synthetic generator.

The repository's ``datasets/`` folder holds small real data sets (``bibtex/``, ``delicious/``),
one Markdown card and one YAML config per data set. A wheel carries the same folder as
``slide/_datasets`` so that ``slide train`` works after ``pip install``; an editable install
reads the repository folder. Data sets too large to ship (Amazon-670K, Delicious-200K) have a
card that says where to download them and a config that expects them beside it; synthetic data of
their shape comes from :func:`make_synthetic`.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from .synthetic import PRESETS, SyntheticSpec, make_synthetic, make_synthetic_arrays, write_synthetic

__all__ = [
    "PRESETS",
    "SyntheticSpec",
    "make_synthetic",
    "make_synthetic_arrays",
    "write_synthetic",
    "datasets_dir",
    "bundled",
    "config_path",
    "card_path",
    "list_datasets",
]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def datasets_dir() -> str:
    """The folder of bundled data, cards and configs.

    The copy installed in the wheel (``<slide>/_datasets``) when present, else the repository's
    ``datasets/`` beside the package (editable installs). Raises ``FileNotFoundError`` when
    neither exists.
    """
    for d in (os.path.join(_PACKAGE_DIR, "_datasets"),
              os.path.join(os.path.dirname(_PACKAGE_DIR), "datasets")):
        if os.path.isdir(d):
            return d
    raise FileNotFoundError("no bundled datasets folder: looked for "
                            f"{os.path.join(_PACKAGE_DIR, '_datasets')} and "
                            f"{os.path.join(os.path.dirname(_PACKAGE_DIR), 'datasets')}")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or name != os.path.basename(name) or name.startswith("."):
        raise ValueError(f"dataset name must be a plain name like 'bibtex', got {name!r}")
    return name


def _bundled_names(root: str) -> List[str]:
    return sorted(e for e in os.listdir(root)
                  if os.path.isfile(os.path.join(root, e, "train.txt")))


def bundled(name: str) -> str:
    """Path of the bundled data set folder ``name`` (holding ``train.txt`` and ``test.txt``).

    Looks in the wheel's copy first, then in the repository (see :func:`datasets_dir`).
    ``FileNotFoundError`` lists the bundled names when ``name`` is not one of them.
    """
    _check_name(name)
    root = datasets_dir()
    path = os.path.join(root, name)
    if not os.path.isfile(os.path.join(path, "train.txt")):
        raise FileNotFoundError(f"no bundled dataset {name!r} in {root}; bundled: "
                                f"{', '.join(_bundled_names(root)) or 'none'}")
    return path


def _shipped_file(name: str, ext: str, what: str) -> str:
    _check_name(name)
    root = datasets_dir()
    path = os.path.join(root, name + ext)
    if not os.path.isfile(path):
        names = sorted(f[: -len(ext)] for f in os.listdir(root) if f.endswith(ext) and f != "README.md")
        raise FileNotFoundError(f"no {what} {name!r} in {root}; available: {', '.join(names)}")
    return path


def config_path(name: str) -> str:
    """Path of the shipped training config ``<name>.yaml`` (e.g. ``bibtex``, ``amazon-670k``)."""
    return _shipped_file(name, ".yaml", "config")


def card_path(name: str) -> str:
    """Path of the dataset card ``<name>.md``."""
    return _shipped_file(name, ".md", "dataset card")


def list_datasets() -> List[Dict[str, Optional[str]]]:
    """Everything known by name, sorted: one dict per name with keys

    ``name``; ``kind`` (``"bundled"``: data shipped here, ``"download"``: a card and config for
    data fetched by the user, ``"synthetic"``: a generator preset); ``path`` (bundled data
    folder), ``config`` and ``card`` (file paths, or ``None``); ``preset`` (``True`` when
    :func:`make_synthetic` has a preset of that name: ``amazon-670k`` is both a downloadable set
    and a synthetic preset of its shape); ``description``.
    """
    try:
        root = datasets_dir()
        entries = os.listdir(root)
    except FileNotFoundError:
        root, entries = None, []
    names = set(_bundled_names(root)) if root else set()
    bundled_names = set(names)
    names |= {e[:-5] for e in entries if e.endswith(".yaml")}
    names |= {e[:-3] for e in entries if e.endswith(".md") and e != "README.md"}
    names |= set(PRESETS)
    out = []
    for name in sorted(names):
        def f(ext):
            p = os.path.join(root, name + ext) if root else None
            return p if p and os.path.isfile(p) else None
        card = f(".md")
        if name in bundled_names:
            kind = "bundled"
        elif name.startswith("synth") or (name in PRESETS and card is None):
            kind = "synthetic"
        else:
            kind = "download"
        out.append({
            "name": name, "kind": kind,
            "path": os.path.join(root, name) if name in bundled_names else None,
            "config": f(".yaml"), "card": card,
            "preset": name in PRESETS,
            "description": (_card_title(card) or (PRESETS[name].description if name in PRESETS else "")
                            or _config_title(f(".yaml"))),
        })
    return out


def _card_title(path: Optional[str]) -> str:
    """First heading of a card, without the ``#``."""
    if not path:
        return ""
    with open(path, "r", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def _config_title(path: Optional[str]) -> str:
    """First comment line of a config, up to its first parenthesis."""
    if not path:
        return ""
    with open(path, "r", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                return line.lstrip("#").split(" (")[0].strip().rstrip(",.:")
            if line.strip():
                break
    return ""
