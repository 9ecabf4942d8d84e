"""Encryption at rest: every stored value cell sealed with AES-256-GCM (docs/semantics.md §7b).

Invariant: a store opened with an `Encryption` writes no value cell in
clear and reads none unless `accept_plaintext` says so. A sealed cell is
`MAGIC | key id (4 bytes) | nonce (12 bytes) | ciphertext and tag`; its
associated data names the kind of cell and the cells beside it that say how
to read it (a write's or inline value's serializer tag; a value row's
channel, key, base, type, count, ordinal, codec and size), so a sealed cell
moved under other such cells does not open. A cell sealed under a key that
is not in the keyring, or whose tag does not hold, is refused, never
decoded.

The nonce is synthetic (SIV): the first 12 bytes of HMAC-SHA256, under a
key of its own derived from the cell key, of the associated data and the
plaintext. The same cell therefore seals to the same bytes (a retried put
is recognised as identical, as without encryption), and two different
cells get the same nonce only with probability 2**-96 per pair.

What is compressed is compressed first (`compression.compress`): the
ciphertext does not compress. The checksum beside each cell covers the
sealed bytes, so damage is named before any decryption, and a forged
checksum still fails the tag.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import bad_argument

__all__ = [
    "AES_SUFFIX",
    "KEY_ENV",
    "OLD_KEYS_ENV",
    "CellRefused",
    "Encryption",
    "encryption_of",
    "key_id_of_cell",
]

# What LangGraph's `EncryptedSerializer.from_pycryptodome_aes` reads the key from.
KEY_ENV = "LANGGRAPH_AES_KEY"
# Keys still accepted for reading (rotation), separated by commas.
OLD_KEYS_ENV = "LGFS_AES_OLD_KEYS"
# The suffix of a sealed write's or inline value's serializer tag, and of a
# value row's codec ("aes" alone when the row is not compressed).
AES_SUFFIX = "+aes"
AES = "aes"
MAGIC = b"\xa7\x01"
_KID = 4
_NONCE = 12
_HEADER = len(MAGIC) + _KID + _NONCE
_TAG = 16


class CellRefused(ValueError):
    """A cell that must not be decoded: in clear, under a foreign key, or tampered with.

    Never leaves the library: readers turn it into `UndecodableRow` naming
    the thread and checkpoint.
    """


def _derive(secret: bytes, label: bytes) -> bytes:
    return hmac.digest(secret, b"lgfs-encryption/" + label, "sha256")


class _Key:
    __slots__ = ("aead", "kid", "key_id", "nonce_key")

    def __init__(self, secret: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.kid = _derive(secret, b"key-id")[:_KID]
        self.key_id = self.kid.hex()
        self.nonce_key = _derive(secret, b"siv-nonce")
        self.aead = AESGCM(_derive(secret, b"aes-256-gcm"))


def _secret(value: Any, argument: str) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, (bytes, bytearray)):
        raise bad_argument(argument, f"expected a 32-byte key (bytes or str), got {type(value)!r}")
    if len(value) != 32:
        raise bad_argument(argument, f"an AES-256 key is 32 bytes, got {len(value)}")
    return bytes(value)


class Encryption:
    """A keyring that seals stored value cells with AES-256-GCM, and the policy for clear cells.

    New cells are sealed under `key`; cells sealed under `key` or any of
    `old_keys` are read, and `lgfs rekey` (or the saver's `rekey`) moves
    them to `key`. A key is 32 bytes (as `bytes`, or a `str` of 32 UTF-8
    bytes as LangGraph's `LANGGRAPH_AES_KEY`); its id is derived from it
    (`key_id`: 8 hex digits, stored in every cell, revealing nothing of it).
    """

    def __init__(
        self,
        key: bytes | str,
        *,
        old_keys: Iterable[bytes | str] = (),
        accept_plaintext: bool = False,
    ) -> None:
        """Seal under `key`, read under `key` and `old_keys`.

        Args:
            key: The current key: 32 bytes.
            old_keys: Keys that sealed cells still stored (rotation).
            accept_plaintext: Read cells stored in clear (a file written
                before encryption was turned on) instead of refusing them:
                for the migration window only, until `rekey` sealed them.

        Raises:
            InvalidArgument: a key that is not 32 bytes, or a non-bool flag.
        """
        try:
            import cryptography  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the [encryption] extra
            raise bad_argument(
                "encryption",
                "needs the cryptography package: pip install 'langgraph-fenced-sqlite[encryption]'",
            ) from exc
        if not isinstance(accept_plaintext, bool):
            raise bad_argument("accept_plaintext", f"expected a bool, got {accept_plaintext!r}")
        if isinstance(old_keys, (str, bytes)):
            raise bad_argument("old_keys", "expected a list of keys, not one key")
        self._current = _Key(_secret(key, "key"))
        self._ring: dict[bytes, _Key] = {self._current.kid: self._current}
        for old in old_keys:
            k = _Key(_secret(old, "old_keys"))
            self._ring.setdefault(k.kid, k)
        self.accept_plaintext = accept_plaintext

    @classmethod
    def from_env(
        cls, *, accept_plaintext: bool = False, environ: Mapping[str, str] | None = None
    ) -> Encryption:
        """Return the keyring of `LANGGRAPH_AES_KEY` (and `LGFS_AES_OLD_KEYS`, comma-separated).

        Raises:
            InvalidArgument: `LANGGRAPH_AES_KEY` is not set, or a key is not 32 bytes.
        """
        env = os.environ if environ is None else environ
        key = env.get(KEY_ENV)
        if not key:
            raise bad_argument(KEY_ENV, "is not set (a 32-byte key)")
        old = [_secret(k, OLD_KEYS_ENV) for k in env.get(OLD_KEYS_ENV, "").split(",") if k]
        return cls(_secret(key, KEY_ENV), old_keys=old, accept_plaintext=accept_plaintext)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, accept_plaintext: bool = False
    ) -> Encryption:
        """Return the keyring of a key file: the current key on its first line, old keys after.

        Each line is the key itself (32 bytes) or `base64:` and its base64.

        Raises:
            InvalidArgument: the file cannot be read or holds no valid key.
        """
        import base64
        import binascii

        try:
            lines = Path(path).read_bytes().splitlines()
        except OSError as exc:
            raise bad_argument("key_file", f"cannot read {str(path)!r}: {exc}") from exc
        keys: list[bytes] = []
        for line in lines:
            if not line.strip():
                continue
            if line.startswith(b"base64:"):
                try:
                    line = base64.b64decode(line[7:].strip(), validate=True)
                except binascii.Error as exc:
                    raise bad_argument("key_file", f"bad base64 key: {exc}") from exc
            keys.append(_secret(line, "key_file"))
        if not keys:
            raise bad_argument("key_file", f"{str(path)!r} holds no key")
        return cls(keys[0], old_keys=keys[1:], accept_plaintext=accept_plaintext)

    @property
    def key_id(self) -> str:
        """The id of the current key (8 hex digits), which new cells are sealed under."""
        return self._current.key_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of every key read (the current one first)."""
        return tuple(k.key_id for k in self._ring.values())

    def __repr__(self) -> str:
        return f"Encryption(key_id={self.key_id!r}, key_ids={self.key_ids!r})"

    def seal(self, aad: bytes, plaintext: bytes) -> bytes:
        """Return `plaintext` sealed under the current key, bound to `aad`."""
        k = self._current
        mac = hmac.new(k.nonce_key, len(aad).to_bytes(4, "big") + aad, hashlib.sha256)
        mac.update(plaintext)
        nonce = mac.digest()[:_NONCE]
        return b"".join((MAGIC, k.kid, nonce, k.aead.encrypt(nonce, plaintext, aad)))

    def open(self, aad: bytes, cell: Any) -> bytes:
        """Return the plaintext of a sealed cell.

        Raises:
            CellRefused: not a sealed cell, a key not in the ring, or a tag that does not hold.
        """
        if type(cell) is not bytes or len(cell) < _HEADER + _TAG or cell[:2] != MAGIC:
            raise CellRefused("not a sealed cell")
        kid = cell[2 : 2 + _KID]
        k = self._ring.get(kid)
        if k is None:
            raise CellRefused(f"sealed under key {kid.hex()!r}, which is not in the keyring")
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(k.aead.decrypt(cell[2 + _KID : _HEADER], cell[_HEADER:], aad))
        except InvalidTag:
            raise CellRefused(
                f"sealed cell under key {kid.hex()!r} does not authenticate (tampered with)"
            ) from None

    def current(self, cell: Any) -> bool:
        """Whether a cell is sealed under the current key."""
        return type(cell) is bytes and cell[:2] == MAGIC and cell[2 : 2 + _KID] == self._current.kid

    def seal_typed(self, tag: str, data: bytes) -> tuple[str, bytes]:
        """Return a serializer's `(tag, bytes)` sealed: `(tag + "+aes", cell)`."""
        return tag + AES_SUFFIX, self.seal(_typed_aad(tag), data)

    def open_typed(self, tag: str, data: bytes) -> tuple[str, bytes]:
        """Return the `(tag, bytes)` a stored cell holds; refuse one in clear unless allowed.

        Raises:
            CellRefused: as `open`, or a cell in clear while `accept_plaintext` is False.
        """
        if tag.endswith(AES_SUFFIX):
            inner = tag[: -len(AES_SUFFIX)]
            return inner, self.open(_typed_aad(inner), data)
        if self.accept_plaintext:
            return tag, data
        raise CellRefused(PLAINTEXT_REFUSED)


PLAINTEXT_REFUSED = (
    "a value stored in clear is refused (encryption is on; to migrate a file written "
    "before, open it with Encryption(..., accept_plaintext=True) and run lgfs rekey)"
)
NO_KEY = (
    "the value is encrypted: open the store with its key "
    f"(encryption=Encryption(...); lgfs: --key-file or ${KEY_ENV})"
)


def _typed_aad(tag: str) -> bytes:
    return b"typed\0" + tag.encode()


def blob_aad(
    channel: Any, key: Any, base: Any, type_: Any, count: Any, ordinal: Any, codec: str, size: Any
) -> bytes:
    """Return the associated data of a value row's sealed `data` (`codec`: the inner one)."""
    return "\0".join(
        (
            "blob",
            str(channel),
            str(key),
            str(base),
            str(type_),
            str(count),
            str(ordinal),
            codec,
            str(size),
        )
    ).encode("utf-8", "surrogatepass")


def key_id_of_cell(cell: Any) -> str | None:
    """Return the key id a stored cell is sealed under; None: not a sealed cell (in clear)."""
    if type(cell) is bytes and len(cell) >= _HEADER + _TAG and cell[:2] == MAGIC:
        return cell[2 : 2 + _KID].hex()
    return None


def encryption_of(serde: Any) -> Encryption | None:
    """Return the `Encryption` a serializer seals with (None: values are stored in clear)."""
    enc = getattr(serde, "encryption", None)
    return enc if isinstance(enc, Encryption) else None
