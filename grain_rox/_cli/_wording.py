"""What the command line says: the tokenizer it used, and library errors in flag syntax.

The library's messages name Python keyword arguments (``if_exists='append'``); a CLI user
needs the flag (``--if-exists append``). :func:`cli_wording` translates them per command.
"""

from __future__ import annotations

import re
from typing import Any


def tokenizer_line(tok: Any, chosen: str | None) -> str:
    """The line ``convert`` prints about the tokenizer it used (and that bytes is a default).

    >>> from grain_rox._text._tokenizers import get_tokenizer
    >>> print(tokenizer_line(get_tokenizer("bytes"), None))
    tokenizer   bytes (vocabulary 257, EOS 256): the default, one token per UTF-8 byte; pass --tokenizer cl100k_base, o200k_base or a tokenizer.json for subword tokens
    """
    eos = "" if tok.eos_id is None else f", EOS {tok.eos_id}"
    line = f"tokenizer   {tok.name} (vocabulary {tok.vocab_size:,}{eos})"
    if chosen is None:
        line += (
            ": the default, one token per UTF-8 byte; pass --tokenizer cl100k_base, o200k_base "
            "or a tokenizer.json for subword tokens"
        )
    return line


# Python keyword arguments that library errors name, and the flag each command spells them
# with. Messages that already name the flag (``--on-null skip (on_null='skip')``) keep both.
# inspect and verify have no writing flags: the fix is a write, by grain-rox convert or by
# Python, so their messages keep the keyword and add the convert flag.
_FLAGS = {
    "convert": {
        "if_exists": "--if-exists",
        "max_shard_bytes": "--max-shard-bytes",
        "block_size": "--block-size",
        "on_binary": "--on-binary",
        "on_null": "--on-null",
        "encoding_errors": "--encoding-errors",
        "text_column": "--text-column",
        "tokenizer": "--tokenizer",
    },
    "export": {
        "overwrite": "--overwrite",
        "eos_id": "--eos-id",
        "group_size": "--group-size",
        "compression": "--compression",
    },
    "inspect": {"if_exists": "grain-rox convert --if-exists"},
    "verify": {"if_exists": "grain-rox convert --if-exists"},
}
_KEYWORD = r"\b{}=(?:'([^']*)'|\"([^\"]*)\"|([\w.]+))?"


def cli_wording(message: str, command: str) -> str:
    """Spell the Python keyword arguments a library error names as ``command``'s flags.

    >>> cli_wording("x.rox exists; pass if_exists='append' to add to it", "convert")
    'x.rox exists; pass --if-exists append to add to it'
    >>> cli_wording("pass max_shard_bytes= to append new shards", "convert")
    'pass --max-shard-bytes to append new shards'
    >>> cli_wording("pass --on-null skip (on_null='skip') to skip them", "convert")
    "pass --on-null skip (on_null='skip') to skip them"
    >>> cli_wording("write again with if_exists='overwrite'", "verify")
    "write again with if_exists='overwrite' (grain-rox convert --if-exists overwrite)"
    """
    for keyword, flag in _FLAGS.get(command, {}).items():
        if flag in message:
            continue

        def spell(m: re.Match[str], flag: str = flag) -> str:
            value = next((g for g in m.groups() if g is not None), "")
            spelled = flag if value in ("", "True") else f"{flag} {value}"
            return f"{m.group(0)} ({spelled})" if flag.startswith("grain-rox ") else spelled

        message = re.sub(_KEYWORD.format(keyword), spell, message)
    return message
