"""The output dtype of token windows must keep every token id as it is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def check_output_dtype(
    dtype: np.dtype,
    stored: Mapping[str, np.dtype],
    eos_ids: Sequence[int | None],
    *,
    where: str,
) -> None:
    """Refuse an output ``dtype`` that would change token ids: one narrower than a source's
    stored dtype (``stored``: how errors name each source -> its dtype; ``uint16`` ids above
    32767 wrap in ``int16``, ``float16`` rounds ids above 2048), or one that cannot hold an
    EOS id, or an EOS id that no token of its source can be (``eos_ids``, when one a source,
    in the order of ``stored``). Unsigned to signed ints of 4 bytes or more (``uint32`` -> the
    default ``int32``) are allowed: no vocabulary reaches 2**31.

    >>> check_output_dtype(np.dtype("int32"), {}, [2**31], where="TokenPipeline")
    Traceback (most recent call last):
    ...
    ValueError: TokenPipeline: dtype=int32 cannot hold the EOS id 2147483648; pass dtype=np.int64
    """
    for label, source_dtype in stored.items():
        wide_ints = (
            source_dtype.kind == "u"
            and dtype.kind == "i"
            and dtype.itemsize >= source_dtype.itemsize >= 4
        )
        if not (np.can_cast(source_dtype, dtype) or wide_ints):
            raise ValueError(
                f"{where}: dtype={dtype.name} would change token ids of {label}, stored as "
                f"{source_dtype.name}; pass a dtype that holds every {source_dtype.name} value "
                f"(e.g. dtype=np.{source_dtype.name}, the stored one)"
            )
    if len(eos_ids) == len(stored):  # each source's EOS id, in order: it must be a token
        for (label, source_dtype), eos in zip(stored.items(), eos_ids, strict=True):
            if eos is None or source_dtype.kind not in "iu":
                continue
            held = np.iinfo(source_dtype)
            if not held.min <= eos <= held.max:
                raise ValueError(
                    f"{where}: eos_id={eos} can never occur in {label}, stored as "
                    f"{source_dtype.name} (ids {held.min} to {held.max}): no document would "
                    "end; pass the id its documents end with (the manifest's, by default)"
                )
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        for eos in eos_ids:
            if eos is not None and not info.min <= eos <= info.max:
                raise ValueError(
                    f"{where}: dtype={dtype.name} cannot hold the EOS id {eos}; pass dtype=np.int64"
                )
