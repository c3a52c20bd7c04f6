"""grain_rox: memory-mapped `.rox` token shards, streamed through Grain into JAX.

>>> import grain_rox
>>> sorted(n for n in grain_rox.__all__ if n.endswith("rox"))
['open_rox', 'write_rox']
"""

import importlib
from typing import TYPE_CHECKING, Any

from grain_rox._manifest import Manifest as Manifest
from grain_rox._manifest import ShardRecord as ShardRecord
from grain_rox._rox_corpus import RoxCorpus as RoxCorpus
from grain_rox._rox_corpus import ShardInfo as ShardInfo
from grain_rox._rox_corpus import open_rox as open_rox
from grain_rox._rox_format import RoxFormatError as RoxFormatError
from grain_rox._rox_writer import WriteResult as WriteResult
from grain_rox._rox_writer import write_rox as write_rox
from grain_rox._tokenizers import ByteTokenizer as ByteTokenizer
from grain_rox._tokenizers import HFTokenizer as HFTokenizer
from grain_rox._tokenizers import TiktokenTokenizer as TiktokenTokenizer
from grain_rox._tokenizers import Tokenizer as Tokenizer
from grain_rox._tokenizers import get_tokenizer as get_tokenizer

if TYPE_CHECKING:  # the pipeline side imports jax, grain and orbax: loaded on first use
    from grain_rox._array_record import ArrayRecordSource as ArrayRecordSource
    from grain_rox._array_record_export import export_array_record as export_array_record
    from grain_rox._batches import shuffled_batches as shuffled_batches
    from grain_rox._checkpoint import RoxCheckpointHandler as RoxCheckpointHandler
    from grain_rox._checkpoint import RoxCheckpointRestore as RoxCheckpointRestore
    from grain_rox._checkpoint import RoxCheckpointSave as RoxCheckpointSave
    from grain_rox._curriculum import Phase as Phase
    from grain_rox._hf_source import HFEagerSource as HFEagerSource
    from grain_rox._hf_stream import HFStreamingSource as HFStreamingSource
    from grain_rox._mixing import mix_datasets as mix_datasets
    from grain_rox._multihost import MultiHostDataLoadIterator as MultiHostDataLoadIterator
    from grain_rox._numpy_source import NumpySource as NumpySource
    from grain_rox._packing import RoxDocumentSource as RoxDocumentSource
    from grain_rox._packing import pack_documents as pack_documents
    from grain_rox._packing import padding_efficiency as padding_efficiency
    from grain_rox._pipeline import GlobalBatchSource as GlobalBatchSource
    from grain_rox._pipeline import TokenPipeline as TokenPipeline
    from grain_rox._pipeline import unpack_windows as unpack_windows
    from grain_rox._rox_source import RoxBlockSource as RoxBlockSource
    from grain_rox._rox_source import RoxTokenSource as RoxTokenSource
    from grain_rox._roxxel_stream import roxxel_stream as roxxel_stream

__version__ = "0.1.0.dev0"

_LAZY = {
    "ArrayRecordSource": "grain_rox._array_record",
    "export_array_record": "grain_rox._array_record_export",
    "GlobalBatchSource": "grain_rox._pipeline",
    "HFEagerSource": "grain_rox._hf_source",
    "HFStreamingSource": "grain_rox._hf_stream",
    "MultiHostDataLoadIterator": "grain_rox._multihost",
    "NumpySource": "grain_rox._numpy_source",
    "Phase": "grain_rox._curriculum",
    "RoxBlockSource": "grain_rox._rox_source",
    "RoxCheckpointHandler": "grain_rox._checkpoint",
    "RoxCheckpointRestore": "grain_rox._checkpoint",
    "RoxCheckpointSave": "grain_rox._checkpoint",
    "RoxDocumentSource": "grain_rox._packing",
    "RoxTokenSource": "grain_rox._rox_source",
    "TokenPipeline": "grain_rox._pipeline",
    "mix_datasets": "grain_rox._mixing",
    "pack_documents": "grain_rox._packing",
    "padding_efficiency": "grain_rox._packing",
    "roxxel_stream": "grain_rox._roxxel_stream",
    "shuffled_batches": "grain_rox._batches",
    "unpack_windows": "grain_rox._pipeline",
}


def __getattr__(name: str) -> Any:
    """Import the JAX/Grain side on first use, so writing and reading shards stay light."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'grain_rox' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ArrayRecordSource",
    "ByteTokenizer",
    "GlobalBatchSource",
    "MultiHostDataLoadIterator",
    "NumpySource",
    "RoxBlockSource",
    "RoxCheckpointHandler",
    "RoxCheckpointRestore",
    "RoxCheckpointSave",
    "RoxDocumentSource",
    "RoxTokenSource",
    "TokenPipeline",
    "HFEagerSource",
    "HFStreamingSource",
    "HFTokenizer",
    "Manifest",
    "Phase",
    "RoxCorpus",
    "RoxFormatError",
    "ShardInfo",
    "ShardRecord",
    "TiktokenTokenizer",
    "Tokenizer",
    "WriteResult",
    "export_array_record",
    "get_tokenizer",
    "mix_datasets",
    "open_rox",
    "pack_documents",
    "padding_efficiency",
    "roxxel_stream",
    "shuffled_batches",
    "unpack_windows",
    "write_rox",
]
