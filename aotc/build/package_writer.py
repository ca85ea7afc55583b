"""Write a package folder atomically: build in a temporary folder beside the target, rename at the end.

A failed, crashed or interrupted build removes its temporary folder, so nothing that looks like a
package is ever left behind; an existing target is replaced only with --force, and only once the new
package is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path

from aotc_runtime import MANIFEST_NAME, Manifest, hash_package_files, write_text_atomically


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


def write_manifest(folder: Path, manifest: Manifest) -> Manifest:
    """Hash every file in the folder into the manifest's `files` and write manifest.json."""
    manifest = dataclasses.replace(manifest, files=hash_package_files(folder))
    write_text_atomically(folder / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=2, default=str) + "\n")
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
