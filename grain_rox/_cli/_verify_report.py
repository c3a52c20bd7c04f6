"""What ``grain-rox verify`` prints: each shard's outcome, grouped by set when the paths hold
several, and a summary that tells healthy sets of different dtypes from damage."""

from __future__ import annotations

from grain_rox._cli._wording import cli_wording
from grain_rox._format._verify import UNCHECKED, ShardReport, shard_sets

_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _count(n: int, noun: str) -> str:
    """``two shard sets``, ``1 shard``-style counts: words up to ten.

    >>> _count(2, "shard set"), _count(1, "shard"), _count(12, "shard")
    ('two shard sets', 'one shard', '12 shards')
    """
    return f"{_WORDS[n] if n < len(_WORDS) else n} {noun}{'' if n == 1 else 's'}"


def verify_lines(reports: list[ShardReport]) -> list[str]:
    """The lines ``grain-rox verify`` prints for ``reports`` (without ``--json``).

    >>> ok = dict(problem=None, num_blocks=2, checksum="ok")
    >>> reports = [ShardReport("d/c_0000.rox", set="d/c", dtype="uint16", **ok),
    ...            ShardReport("d/t.rox", set="d/t", dtype="uint32", **ok)]
    >>> print("\\n".join(verify_lines(reports)))
    set d/c: one shard, uint16
    OK   d/c_0000.rox: 2 blocks, checksum ok
    set d/t: one shard, uint32
    OK   d/t.rox: 2 blocks, checksum ok
    2 of 2 shards OK, in two shard sets
    two shard sets of different dtypes: d/c (uint16), d/t (uint32); different sets, not damage: one corpus holds one dtype, so open each set on its own (e.g. grain-rox inspect d/c.rox, open_rox('d/c.rox')), not all as one corpus
    """
    sets = shard_sets(reports)
    shards = [r for group in sets.values() for r in group]
    bad = [r for r in shards if not r.ok]
    # shards left unchecked by their set's unusable manifest: said in full once, not damage
    unchecked = [r for r in bad if (r.problem or "").startswith(UNCHECKED)]
    said: set[str] = set()
    leftovers = [r for r in reports if r.kind == "leftover"]
    lines = []
    for name, group in sets.items():
        if len(sets) > 1:
            kinds = sorted({r.dtype for r in group if r.dtype is not None})
            lines.append(
                f"set {name}: {_count(len(group), 'shard')}, {', '.join(kinds) or 'dtype unreadable'}"
            )
        for r in group:
            if r.ok:
                note = f"; WARN: {cli_wording(r.note, 'verify')}" if r.note else ""
                lines.append(f"OK   {r.path}: {r.num_blocks} blocks, checksum {r.checksum}{note}")
            elif r in unchecked and r.problem in said:
                lines.append(f"FAIL {r.path}: not checked, as above")
            else:
                said.add(r.problem or "")
                lines.append(f"FAIL {r.path}: {cli_wording(r.problem or '', 'verify')}")
    lines += [f"WARN {r.path}: {r.note}" for r in leftovers]
    damaged = len(bad) - len(unchecked)
    lines.append(
        f"{len(shards) - len(bad)} of {len(shards)} shards OK"
        + (f", in {_count(len(sets), 'shard set')}" if len(sets) > 1 else "")
        + (f"; {damaged} damaged" if damaged else "")
        + (f"; {len(unchecked)} not checked (a file of their set is unusable)" if unchecked else "")
        + (f"; {len(leftovers)} leftover temporary file(s)" if leftovers else "")
    )
    # A set's dtype is its first readable shard's (a shard of another dtype is damage, above).
    dtypes = {name: next((r.dtype for r in g if r.dtype), None) for name, g in sets.items()}
    known = {name: dtype for name, dtype in dtypes.items() if dtype is not None}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{name} ({dtype})" for name, dtype in known.items())
        first = next(iter(known))
        lines.append(
            f"{_count(len(known), 'shard set')} of different dtypes: {listed}; different "
            "sets, not damage: one corpus holds one dtype, so open each set on its own (e.g. "
            f"grain-rox inspect {first}.rox, open_rox('{first}.rox')), not all as one corpus"
        )
    return lines
