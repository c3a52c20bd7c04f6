"""A Griffe extension for the API reference: the doctest examples that open at the margin of
grain_rox's docstrings (run by pytest as they are) are shown as Python console code blocks,
not read as Markdown (where ``>>>`` is a blockquote and ``x[:, 1:]`` a link), and Sphinx
roles (``:func:`~grain_rox.open_rox```) as inline code (``open_rox``).

mkdocs.yml loads it for mkdocstrings' Python handler (``extensions:``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (a ``>>>`` line at the margin up to a blank line) in a
    ``pycon`` code fence; text inside existing fences is left alone.

    >>> fence_doctests("Sum:\\n\\n>>> 1 + 1\\n2\\n\\nDone.").split("\\n")
    ['Sum:', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'Done.']
    """
    out: list[str] = []
    fenced = in_doctest = False
    for line in text.split("\n"):
        if in_doctest and not line.strip():
            out.append("```")
            in_doctest = False
        elif not in_doctest and not fenced and line.startswith(">>>"):
            out.append("```pycon")
            in_doctest = True
        elif not in_doctest and line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line)
    if in_doctest:
        out.append("```")
    return "\n".join(out)


_ROLE = re.compile(r":(?:py:)?(?:func|meth|attr|class|mod|data|exc|obj):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """Sphinx cross-reference roles as inline code (``~`` keeps the last name only).

    >>> plain_roles("see :func:`~grain_rox.open_rox` and :meth:`unpack`")
    'see `open_rox` and `unpack`'
    """
    return _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class DoctestFences(griffe.Extension):
    """Fence the margin doctests of every docstring Griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(plain_roles(obj.docstring.value))
