"""`python -m aotc_runtime.serve PKG`: `aotc-serve` without its console script."""

import sys

from aotc_runtime.serve.command import main

if __name__ == "__main__":
    sys.exit(main())
