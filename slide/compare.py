"""Old home of the comparison harness, kept so that ``from slide.compare import run_compare``
still works; the harness lives in :mod:`slide.baselines.compare`, next to the baselines it runs.
``import slide`` imports neither."""
import warnings

from .baselines.compare import BASELINES, default_marks, format_table, run_compare

__all__ = ["run_compare", "default_marks", "format_table", "BASELINES"]

warnings.warn("slide.compare moved to slide.baselines.compare", DeprecationWarning, stacklevel=2)
