"""The checksum stored beside every value (CONTRACT §7).

Invariant: a row's checksum is computed from exactly the cells it covers, in
one fixed order, by this one function, on write (in Python) and in
migrations (as the SQL function the engine registers); a read recomputes it
and refuses the row on any difference, so damage is never decoded.
"""

from __future__ import annotations

import zlib

__all__ = ["checksum"]


def checksum(*parts: str | bytes | None) -> int:
    """Return the CRC-32 of `parts`, each length-prefixed, as stored beside a value.

    Length prefixes make the split between parts count: moving bytes from one
    cell to its neighbour changes the checksum. `None` and empty differ too.
    Every stored value's row carries this (CONTRACT §7); a read recomputes it,
    so a flipped bit, appended bytes or a cut cell is caught, never decoded.
    """
    crc = 0
    for part in parts:
        if part is None:
            crc = zlib.crc32(b"\xff\xff\xff\xff", crc)
            continue
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else bytes(part)
        crc = zlib.crc32(len(data).to_bytes(4, "little"), crc)
        crc = zlib.crc32(data, crc)
    return crc
