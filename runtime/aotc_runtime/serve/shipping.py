"""How a package reaches the replicas. On the machine that runs `aotc serve` (local Ray) each replica
reads the folder itself. On a cluster (`--address`, or `--ship`) the files go through Ray: a store
actor holds them and each replica copies them into a temporary folder of its own machine, then loads
that copy with the usual checks; the manifest's hashes vouch for every byte that travelled, and
with `--require-signature` the replica checks the signature over that manifest itself.

The store is an actor, not ObjectRefs in the deployment's arguments: Ray Serve pickles those
arguments into its controller's state, and a reference pickled there is not kept alive by anyone.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger("aotc.serve")

STORE_NAMESPACE = "aotc"


def package_file_names(folder: Path) -> list[str]:
    """Every regular file of the package, as relative POSIX paths (manifest and signature included)."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    )


class PackageStore:
    """Holds one package's files in memory for replicas on other machines (a Ray actor)."""

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    def put(self, name: str, data: bytes) -> None:
        self._files[name] = data

    def names(self) -> list[str]:
        return sorted(self._files)

    def read(self, name: str) -> bytes:
        return self._files[name]


def ship(folder: Path, store_name: str, detached: bool) -> ActorHandle:
    """Start the named store actor and send it the package's files, one call per file (a file goes
    through Ray's object store once, never the whole package at once)."""
    import ray

    # Any: Ray's types give a handle's methods as the class's plain functions, without `.remote`
    actor: Any = (
        ray.remote(num_cpus=0)(PackageStore)
        .options(
            name=store_name,
            namespace=STORE_NAMESPACE,
            lifetime="detached" if detached else None,
            get_if_exists=False,
        )
        .remote()
    )
    pending = []
    for name in package_file_names(folder):
        pending.append(actor.put.remote(name, (folder / name).read_bytes()))
        if len(pending) >= 4:  # bound what is in flight: a package can be gigabytes
            ray.get(pending)
            pending = []
    ray.get(pending)
    return actor


def _inside(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


@dataclass(frozen=True)
class PackageSource:
    """Where a replica finds the package: a folder it can read, or the store actor of that name."""

    path: str | None = None
    store_name: str | None = None

    def describe(self) -> str:
        return self.path if self.path else f"the package shipped through Ray ({self.store_name})"

    def materialize(self) -> Path:
        """A local folder holding the package (a fresh copy when shipped)."""
        if self.path is not None:
            return Path(self.path)
        import ray

        assert self.store_name is not None  # a source is a folder or a store
        # Any: a handle's methods and their `.remote` are made at run time, unknown to Ray's types
        store: Any = ray.get_actor(self.store_name, namespace=STORE_NAMESPACE)
        folder = Path(tempfile.mkdtemp(prefix="aotc-serve-"))
        try:
            for name in ray.get(store.names.remote()):
                if not _inside(name):  # the store is ours, but a path never leaves the folder
                    raise ValueError(f"shipped file name {name!r} leaves the package folder")
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(ray.get(store.read.remote(name)))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        logger.info("package copied from %s into %s", self.store_name, folder)
        return folder

    def release(self, folder: Path) -> None:
        """Remove a shipped copy (a folder the user gave is never touched)."""
        if self.path is None:
            shutil.rmtree(folder, ignore_errors=True)


def release_when_read(source: PackageSource, folder: Path | None) -> None:
    """A replica's shipped copy, removed once the replica has read it: the compiled model unpacks
    into a folder of its own as it loads, and the state, members, tokenizer and chat template are
    in memory by then. Removed at once because Ray ends a replica by killing its process, which
    runs no `__del__` (shipped copies were left in the temp folder, one per replica start). A
    folder the user gave is never touched."""
    if folder is not None:
        source.release(folder)


def load_package(folder: Path, public_key_pem: bytes | None) -> Any:
    """aotc_runtime.load of a replica's folder; with a key, the package must be signed by it. The
    key travels as its PEM bytes (a replica on another machine has no copy of the file), and is
    written to a file of this process's own for load to read."""
    from aotc_runtime import load

    if public_key_pem is None:
        return load(folder)
    with tempfile.TemporaryDirectory(prefix="aotc-serve-key-") as keys:
        key = Path(keys) / "public.pem"
        key.write_bytes(public_key_pem)
        return load(folder, public_key=key)
