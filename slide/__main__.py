"""``python -m slide ...`` runs the command line (same as the ``slide`` script)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
