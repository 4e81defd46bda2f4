"""``python -m slhub``: the same entry as the ``slhub`` console script."""

import sys

from slhub.cli import main

if __name__ == "__main__":
    sys.exit(main())
