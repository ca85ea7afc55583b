"""Child process of the shared-weights step: the names of the constants a compiled program takes.

Loading a program runs its native code, and a package assembled from the build cache is checked
before the build trusts it (aotc/tune/driver.py), so it is loaded here, in a process of its own,
never in the build's.
usage: python -m aotc.compiler.constant_names_child PACKAGE  ->  a JSON list on stdout
"""

import json
import sys
from pathlib import Path


def main(package_path: str) -> int:
    from aotc_runtime import read_manifest
    from aotc_runtime.package import _open_model

    path = Path(package_path)
    loader = _open_model(path, read_manifest(path), 1)
    print(json.dumps(list(loader.get_constant_fqns())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
