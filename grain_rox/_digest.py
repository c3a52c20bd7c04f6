"""The short content digest that data sources put in their reprs (Grain compares reprs when it
restores a checkpoint, so a repr must change when, and only when, the data or config does)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def facts_digest(facts: Any) -> str:
    """16 hex digits of the SHA-1 of ``facts`` as JSON (lists, dicts, strings, numbers).

    >>> facts_digest(["a.rox", 4096, {"seed": 0}])
    'ee0c275135cc25d3'
    """
    return hashlib.sha1(json.dumps(facts).encode()).hexdigest()[:16]
