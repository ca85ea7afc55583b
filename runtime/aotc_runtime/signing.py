"""Package signatures: ed25519 over manifest.json's exact bytes, in manifest.json.sig.

The manifest records the sha256 of every other file, so a signature over the manifest covers the
whole package, as long as the files are checked against it too (load() does both unless
verify=False). The signature file holds the raw 64-byte signature, no encoding: the same bytes
`openssl pkeyutl -sign -rawin` writes, so a package can be checked without aotc.
Keys are PEM: PKCS8 (unencrypted) for the private key, SubjectPublicKeyInfo for the public key.

cryptography is imported only here and only when a signature is made or checked: the runtime's one
hard dependency stays torch.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import MissingDependencyError, PackageError
from .files import replaced_atomically, write_text_atomically
from .manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_FILE,
    check_finished,
    read_manifest,
    verify_files,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SIGNATURE_BYTES = 64  # an ed25519 signature
MAX_KEY_BYTES = 64 << 10  # an ed25519 PEM key is about 120 bytes; read no more than this
CRYPTOGRAPHY_PIN = "cryptography==50.0.2"  # requirements.txt's pin
SIGN_HINT = "sign it with `aotc sign {folder} --key PRIVATE_KEY.pem`"
KEYGEN_HINT = "make a key pair with `aotc keygen --private-key KEY.pem --public-key KEY.pub.pem`"


def verify_signature(folder: str | os.PathLike, public_key_path: str | os.PathLike) -> bytes:
    """Refuse (PackageError) a package that is unsigned, or whose manifest.json is not what the
    holder of `public_key_path`'s private key signed. The other files are vouched for only once
    verify_files has checked them against this manifest (load always does when given a key).
    Returns the manifest's bytes that were verified, so the caller parses exactly those."""
    folder = Path(folder)
    _require_cryptography()
    from cryptography.exceptions import InvalidSignature

    manifest = _manifest_bytes(folder)
    key = _public_key(Path(public_key_path))
    signature = _read_signature(folder)
    try:
        key.verify(signature, manifest)
    except InvalidSignature:
        raise PackageError(
            f"package {folder} fails its signature check against {public_key_path}: its {MANIFEST_NAME} "
            "was changed after it was signed, or signed by another key; get the package again from "
            "whoever signed it, or pass the public key of the key that signed it"
        ) from None
    return manifest


def sign_package(folder: str | os.PathLike, private_key_path: str | os.PathLike) -> Path:
    """Write folder/manifest.json.sig; returns its path. A package that is damaged or unfinished
    is refused first: a signature must never vouch for files other than the ones the build wrote."""
    folder = Path(folder)
    _require_cryptography()
    key = _private_key(Path(private_key_path))
    manifest = _manifest_bytes(folder)
    parsed = read_manifest(folder)
    check_finished(folder, parsed)
    verify_files(folder, parsed)
    if _manifest_bytes(folder) != manifest:  # what was checked must be what is signed
        raise PackageError(
            f"{folder / MANIFEST_NAME} changed while it was being signed; sign it again once "
            "nothing else writes the package"
        )
    target = folder / SIGNATURE_FILE
    with replaced_atomically(target) as tmp:
        tmp.write_bytes(key.sign(manifest))
    return target


def generate_keypair(
    private_path: str | os.PathLike, public_path: str | os.PathLike, force: bool = False
) -> None:
    """A new ed25519 key pair: the private key (PEM PKCS8, unencrypted, mode 0600) and the public key.

    Raises FileExistsError when either file exists and not `force`, ValueError when both paths
    name the same file.
    """
    private_path, public_path = Path(private_path), Path(public_path)
    _require_cryptography()
    if private_path.resolve() == public_path.resolve():
        raise ValueError(f"the private and the public key would both be written to {private_path}")
    if not force:
        for path in (private_path, public_path):
            if path.exists() or path.is_symlink():
                raise FileExistsError(
                    errno.EEXIST, f"{path} already exists; pass force=True to replace it", str(path)
                )
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    _write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_text_atomically(public_path, public.decode("ascii"))


def _require_cryptography() -> None:
    try:
        import cryptography.hazmat.primitives.asymmetric.ed25519  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"package signing needs cryptography, which cannot be imported ({exc}); "
            f"pip install {CRYPTOGRAPHY_PIN}"
        ) from None


def _write_private(path: Path, data: bytes) -> None:
    with replaced_atomically(path) as tmp:
        # Created 0600 rather than chmod-ed after: the key is never readable by others, not even briefly.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)


def _read_bounded(path: Path, limit: int) -> bytes:
    """At most limit + 1 bytes: enough to tell a file that is too large without reading all of it.
    Only a regular file: opening a FIFO for reading waits for a writer forever (O_NONBLOCK does
    not), and a device may never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb") as handle:
            fd = -1  # the handle owns it now
            return handle.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)


def _manifest_bytes(folder: Path) -> bytes:
    path = folder / MANIFEST_NAME
    if not path.is_file():
        read_manifest(folder)  # raises its refusal: no such folder, or no manifest in it
    try:
        data = _read_bounded(path, MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise PackageError(
            f"{path} cannot be read ({exc.strerror or type(exc).__name__}); rebuild the package with `aotc build`"
        ) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise PackageError(
            f"{path} is larger than the {MAX_MANIFEST_BYTES >> 20} MiB a manifest may have; "
            "rebuild the package with `aotc build`"
        )
    return data


def _read_signature(folder: Path) -> bytes:
    path = folder / SIGNATURE_FILE
    if not path.exists():
        raise PackageError(
            f"package {folder} is not signed (it has no {SIGNATURE_FILE}); {SIGN_HINT.format(folder=folder)}"
        )
    try:
        data = _read_bounded(path, SIGNATURE_BYTES)
    except OSError as exc:
        raise PackageError(
            f"{path} cannot be read ({exc.strerror or type(exc).__name__}); {SIGN_HINT.format(folder=folder)}"
        ) from None
    if len(data) != SIGNATURE_BYTES:
        size = f"{len(data)} bytes" if len(data) <= SIGNATURE_BYTES else "larger"
        raise PackageError(
            f"{path} is {size}, not a {SIGNATURE_BYTES}-byte ed25519 signature; "
            f"{SIGN_HINT.format(folder=folder)}"
        )
    return data


def _read_key(path: Path, which: str) -> bytes:
    try:
        data = _read_bounded(path, MAX_KEY_BYTES)
    except OSError as exc:
        raise PackageError(
            f"{which} key {path} cannot be read ({exc.strerror or type(exc).__name__}); "
            f"pass the PEM file `aotc keygen` wrote, or {KEYGEN_HINT}"
        ) from None
    if len(data) > MAX_KEY_BYTES:
        raise PackageError(
            f"{which} key {path} is larger than {MAX_KEY_BYTES >> 10} KiB, so not a PEM ed25519 key; {KEYGEN_HINT}"
        )
    return data


def _public_key(path: Path) -> Ed25519PublicKey:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    data = _read_key(path, "public")
    try:
        key = load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        hint = (
            " (it is a private key: pass the public key that `aotc keygen --public-key` wrote)"
            if b"PRIVATE KEY-----" in data
            else ""
        )
        raise PackageError(
            f"public key {path} is not a PEM public key{hint}; {KEYGEN_HINT}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise PackageError(
            f"public key {path} is not an Ed25519 key ({type(key).__name__}); aotc signs with ed25519: {KEYGEN_HINT}"
        )
    return key


def _private_key(path: Path) -> Ed25519PrivateKey:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = _read_key(path, "private")
    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:  # cryptography's word for "encrypted, and no password given"
        raise PackageError(
            f"private key {path} is encrypted; aotc signs with the unencrypted PEM key `aotc keygen` "
            "writes (keep it safe by file permissions): decrypt it, or "
            f"{KEYGEN_HINT}"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        hint = (
            " (it is a public key: sign with the private key that `aotc keygen --private-key` wrote)"
            if b"PUBLIC KEY-----" in data
            else ""
        )
        raise PackageError(
            f"private key {path} is not a PEM private key{hint}; {KEYGEN_HINT}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PackageError(
            f"private key {path} is not an Ed25519 key ({type(key).__name__}); aotc signs with ed25519: {KEYGEN_HINT}"
        )
    return key
