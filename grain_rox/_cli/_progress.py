"""The command line's progress bars: a total, a percent and an ETA wherever the total is known
(the input files' bytes, the shards' bytes, the documents asked for), a count and a rate where
it is not. ``tqdm`` draws them on a terminal and stays quiet otherwise (CI logs, pipes); while
a bar is drawn, log lines are printed above it instead of through it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

_BYTES = "{l_bar}{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]"


class _Quiet:
    """A bar that draws nothing (``--no-progress``)."""

    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def byte_bar(total: int | None, desc: str, *, enabled: bool = True) -> Iterator[Any]:
    """A bar counting bytes out of ``total``: ``desc:  45%|████▌     | 1.20GB/2.67GB [00:10<00:12,
    120MB/s]``. Call ``bar.update(n)`` with the bytes done; with ``total=None`` or
    ``enabled=False`` it draws nothing.

    >>> with byte_bar(None, "reading") as bar:
    ...     bar.update(10)
    """
    if total is None or not enabled:
        yield _Quiet()
        return
    with _drawn(total=total, desc=desc, unit="B", unit_scale=True, bar_format=_BYTES) as bar:
        yield bar


def count_bar(
    items: Iterable[Any], total: int | None, desc: str, unit: str, *, enabled: bool = True
) -> Iterator[Any]:
    """``items``, counted on a bar: out of ``total`` (percent and ETA) when it is known.

    >>> list(count_bar(iter("ab"), 2, "converting", "doc"))
    ['a', 'b']
    """
    if not enabled:
        yield from items
        return
    with _drawn(items, total=total, desc=desc, unit=unit) as bar:
        yield from bar


@contextlib.contextmanager
def _drawn(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """A tqdm bar, quiet unless stderr is a terminal (``disable=None``), with the root logger's
    console lines written above it while it is drawn."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    with tqdm(*args, disable=None, **kwargs) as bar:
        if bar.disable:
            yield bar
            return
        with logging_redirect_tqdm(tqdm_class=tqdm):
            yield bar
