"""Hand-built ROXXEL02 shard bytes for tests: any footer field can be made wrong on purpose.

The layout is written out here independently of grain_rox's own code, so tests built on it
check grain_rox against the format, not against itself.
"""

from __future__ import annotations

import itertools
import struct

FOOTER = struct.Struct("<qq8s8s")
SIGNATURE = b"ROXXEL02"


def make_shard(
    blocks: list[bytes],
    dtype: str = "uint8",
    ends: list[int] | None = None,
    *,
    num_blocks: int | None = None,
    raw_size: int | None = None,
    dtype_field: bytes | None = None,
    signature: bytes = SIGNATURE,
) -> bytes:
    """Return the bytes of a shard holding ``blocks``; keyword arguments override footer fields.

    ``ends`` overrides the index (default: cumulative block lengths, as every writer makes it).
    """
    raw = b"".join(blocks)
    if ends is None:
        ends = list(itertools.accumulate(len(b) for b in blocks))
    index = struct.pack(f"<{len(ends)}q", *ends)
    footer = FOOTER.pack(
        len(ends) if num_blocks is None else num_blocks,
        len(raw) if raw_size is None else raw_size,
        dtype.encode("ascii").ljust(8, b"\x00") if dtype_field is None else dtype_field,
        signature,
    )
    return raw + index + footer
