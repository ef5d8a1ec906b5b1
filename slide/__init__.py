"""slide: sparse training for extreme classification.

Networks whose output layer has 10^5-10^7 neurons are trained by computing, per
sample, only the neurons that locality-sensitive hash tables select (SLIDE,
Chen et al., MLSys 2020), on all CPU cores.
"""
from . import _core
from .config import Config, ConfigError
from .data import Dataset, DataError, load_dataset
from .network import Network, History
from . import callbacks
from . import metrics, datasets

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "Dataset", "DataError", "load_dataset", "Network", "History",
           "callbacks", "metrics", "datasets", "__version__"]
