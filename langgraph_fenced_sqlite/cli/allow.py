"""The CLI's allow-list: the saver's `allowed_types`/`allowed_modules` as options.

Invariant: every `lgfs` command reads with the same allow-list the app's saver
uses (`--allow-type MODULE:NAME`, `--allow-module PKG`, or `$LGFS_ALLOW`), and a
value outside it is shown as tagged data (`TaggedValue`: type name and fields),
built without importing or calling anything; only the importer, which writes
what it reads, refuses such a value instead.

The key is taken the same way: every command opens its store with the
keyring the app's saver uses (`--key-file PATH`, else `$LANGGRAPH_AES_KEY`
with `$LGFS_AES_OLD_KEYS`), or none; `--accept-plaintext` reads (and lets
`rekey` seal) cells stored in clear.
"""

from __future__ import annotations

import argparse
import os
from typing import TypeVar

from ..core.encryption import KEY_ENV, OLD_KEYS_ENV, Encryption
from ..core.serde import DataOnlySerializer
from ..core.user_types import ALLOW_ENV, parse_allow
from .io import CliError

__all__ = ["ALLOW_ENV", "add_allow_options", "allow_from_args", "cli_serde"]

_P = TypeVar("_P", bound=argparse.ArgumentParser)


# Set once per `main()` call from its arguments; `_open` reads it.
_allow: tuple[tuple[tuple[str, ...], ...], tuple[str, ...]] = ((), ())
_keyring: Encryption | None = None


def add_allow_options(parser: _P) -> _P:
    """Add `--allow-type` and `--allow-module` to `parser` (a parent of every command)."""
    parser.add_argument(
        "--allow-type",
        action="append",
        metavar="MODULE:NAME",
        help=f"rebuild values of this class (the saver's allowed_types; also ${ALLOW_ENV})",
    )
    parser.add_argument(
        "--allow-module",
        action="append",
        metavar="PKG",
        help="rebuild values of classes in this package (the saver's allowed_modules)",
    )
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        help=f"the encryption keyring: current key on the first line, older keys after "
        f"(default: ${KEY_ENV}, ${OLD_KEYS_ENV})",
    )
    parser.add_argument(
        "--accept-plaintext",
        action="store_true",
        help="read values stored in clear, and let rekey seal them (a migration)",
    )
    return parser


def allow_from_args(args: argparse.Namespace) -> None:
    """Take the allow-list from `$LGFS_ALLOW` plus the parsed options.

    Raises:
        CliError: an `--allow-type` is not `MODULE:NAME`, or `--accept-plaintext`
            without a key.
        InvalidArgument: an entry of `$LGFS_ALLOW` is malformed, or a name
            is not a module name.
    """
    global _allow
    # `$LGFS_ALLOW` has one syntax, shared with the Agent Server's factory.
    keys, modules = parse_allow(os.environ.get(ALLOW_ENV, ""), ALLOW_ENV)
    modules += list(getattr(args, "allow_module", None) or [])
    for entry in getattr(args, "allow_type", None) or []:
        module, _, name = entry.partition(":")
        if not (module and name):
            raise CliError("usage", f"--allow-type {entry!r}: expected MODULE:NAME")
        keys.append((module, name))
    DataOnlySerializer(keys, allowed_modules=modules)  # refuses a malformed entry, naming it
    _allow = (tuple(keys), tuple(modules))
    global _keyring
    accept = bool(getattr(args, "accept_plaintext", False))
    key_file = getattr(args, "key_file", None)
    if key_file is not None:
        _keyring = Encryption.from_file(key_file, accept_plaintext=accept)
    elif os.environ.get(KEY_ENV):
        _keyring = Encryption.from_env(accept_plaintext=accept)
    elif accept:
        raise CliError("usage", f"--accept-plaintext needs a key (--key-file or ${KEY_ENV})")
    else:
        _keyring = None


def cli_serde(unknown: str = "tag") -> DataOnlySerializer:
    """Return a serializer with the CLI's allow-list.

    Args:
        unknown: `"tag"` for commands that display (a value outside the list
            is shown as type and fields); `"refuse"` for the importer.
    """
    types, modules = _allow
    serde = DataOnlySerializer(types, allowed_modules=modules, unknown=unknown)
    return serde.with_encryption(_keyring)
