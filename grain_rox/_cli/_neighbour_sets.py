"""Shard sets of another tokenizer beside the one a conversion writes: a pipeline over their
directory refuses to join them, so ``grain-rox convert`` says so before it starts."""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from grain_rox._format._manifest import MANIFEST_SUFFIX, load_manifest, manifest_path_for
from grain_rox._format._object_store import is_url
from grain_rox._format._rox_corpus import tokenizer_key, tokenizer_words

logger = logging.getLogger("grain_rox")


def sets_of_other_tokenizers(output: str, tokenizer: dict[str, Any]) -> list[str]:
    """The manifests beside ``output`` (a local shard path) of sets written with a tokenizer
    other than ``tokenizer`` (a manifest's record), each as ``path (tokenizer ...)``; sets of
    token ids (no tokenizer recorded) and unreadable manifests are not listed.

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> d = tempfile.mkdtemp()
    >>> _ = write_rox(["a text"], os.path.join(d, "bytes.rox"), tokenizer="bytes")
    >>> from grain_rox._text._tokenizers import get_tokenizer
    >>> [os.path.basename(s) for s in sets_of_other_tokenizers(
    ...     os.path.join(d, "new.rox"), get_tokenizer("cl100k_base").identity())]
    ["bytes.manifest.json (tokenizer 'bytes')"]
    """
    if is_url(output):
        return []
    own = manifest_path_for(output)
    key = tokenizer_key(tokenizer)
    found = []
    pattern = os.path.join(glob.escape(os.path.dirname(os.path.abspath(output))), "*")
    for path in sorted(glob.glob(pattern + MANIFEST_SUFFIX)):
        if os.path.abspath(path) == os.path.abspath(own):
            continue
        try:
            manifest = load_manifest(path)
        except (OSError, ValueError):  # (a RoxFormatError too)
            continue  # (its own set's reads name it)
        if manifest is None or manifest.tokenizer is None:
            continue
        if tokenizer_key(manifest.tokenizer) != key:
            found.append(f"{path} ({tokenizer_words(manifest.tokenizer)})")
    return found


def warn_of_other_tokenizers(output: str, tokenizer: dict[str, Any]) -> None:
    """Log a warning naming the sets beside ``output`` of another tokenizer (see above)."""
    others = sets_of_other_tokenizers(output, tokenizer)
    if others:
        shown = "; ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        logger.warning(
            "%s is written beside shard sets of another tokenizer (%s): a TokenPipeline over "
            "their directory refuses to join them (the same token id is other text in each); "
            "write each tokenizer's sets to a directory of their own",
            output,
            shown,
        )
