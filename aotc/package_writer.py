"""Write a package folder atomically: build in a temporary folder beside the target, rename at the end.

A failed, crashed or interrupted build removes its temporary folder, so nothing that looks like a
package is ever left behind; an existing target is replaced only with --force, and only once the new
package is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from aotc_runtime.manifest import MANIFEST_NAME, hash_package_files


@contextlib.contextmanager
def staging_folder(target: Path):
    """Yield a fresh temporary folder beside `target`; removed unless `commit()` moved it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.aotc-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_manifest(folder: Path, manifest: dict) -> dict:
    """Hash every file in the folder into manifest['files'] and write manifest.json."""
    manifest = {**manifest, "files": hash_package_files(folder)}
    tmp = folder / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(folder / MANIFEST_NAME)
    return manifest


def commit(staging: Path, target: Path) -> None:
    """Move the finished package into place, replacing an old one only now that the new one is whole."""
    target = Path(target)
    if target.exists():
        old = target.parent / f".{target.name}.aotc-old-{os.getpid()}"
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    else:
        staging.rename(target)
