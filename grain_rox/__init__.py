"""grain_rox: memory-mapped `.rox` token shards, streamed through Grain into JAX.

>>> import grain_rox
>>> sorted(n for n in grain_rox.__all__ if n.endswith("rox"))
['open_rox', 'write_rox']
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

# The public names, each with the module that defines it. Nothing is imported until first use, so
# ``import grain_rox`` stays light (no JAX, no Grain); the pipeline side is loaded when touched.
_LAZY: dict[str, str] = {
    "Manifest": "grain_rox._format._manifest",
    "ShardRecord": "grain_rox._format._manifest",
    "open_rox": "grain_rox._format._rox_corpus",
    "RoxCorpus": "grain_rox._format._rox_corpus",
    "ShardInfo": "grain_rox._format._rox_corpus",
    "RoxFormatError": "grain_rox._format._rox_format",
    "object_store_stats": "grain_rox._format._object_store",
    "write_rox": "grain_rox._text._rox_writer",
    "builtin_documents": "grain_rox._text._builtin_corpus",
    "read_documents": "grain_rox._text._convert",
    "ReadStats": "grain_rox._text._document_readers",
    "WriteResult": "grain_rox._text._rox_writer",
    "ByteTokenizer": "grain_rox._text._tokenizers",
    "get_tokenizer": "grain_rox._text._tokenizers",
    "HFTokenizer": "grain_rox._text._hf_tokenizer",
    "TiktokenTokenizer": "grain_rox._text._tiktoken",
    "Tokenizer": "grain_rox._text._tokenizers",
    "Phase": "grain_rox._order._curriculum",
    "ArrayRecordSource": "grain_rox._sources._array_record",
    "export_array_record": "grain_rox._sources._array_record_export",
    "shuffled_batches": "grain_rox._sources._batches",
    "HFEagerSource": "grain_rox._sources._hf_source",
    "HFStreamingSource": "grain_rox._sources._hf_stream",
    "NumpySource": "grain_rox._sources._numpy_source",
    "RoxDocumentSource": "grain_rox._sources._rox_documents",
    "RoxBlockSource": "grain_rox._sources._rox_source",
    "RoxTokenSource": "grain_rox._sources._rox_source",
    "unpack_windows": "grain_rox._sources._segments",
    "GlobalBatchSource": "grain_rox._pipeline._batch_source",
    "mix_datasets": "grain_rox._pipeline._mixing",
    "pack_documents": "grain_rox._pipeline._packing",
    "padding_efficiency": "grain_rox._pipeline._packing",
    "TokenPipeline": "grain_rox._pipeline._pipeline",
    "RoxCheckpointHandler": "grain_rox._devices._checkpoint",
    "RoxCheckpointRestore": "grain_rox._devices._checkpoint",
    "RoxCheckpointSave": "grain_rox._devices._checkpoint",
    "MultiHostDataLoadIterator": "grain_rox._devices._multihost",
    "roxxel_stream": "grain_rox._roxxel._roxxel_stream",
}

__all__ = sorted(_LAZY, key=str.lower)

if TYPE_CHECKING:  # the same names for type checkers; tests/test_public_api.py keeps it == _LAZY
    from grain_rox._devices._checkpoint import RoxCheckpointHandler as RoxCheckpointHandler
    from grain_rox._devices._checkpoint import RoxCheckpointRestore as RoxCheckpointRestore
    from grain_rox._devices._checkpoint import RoxCheckpointSave as RoxCheckpointSave
    from grain_rox._devices._multihost import MultiHostDataLoadIterator as MultiHostDataLoadIterator
    from grain_rox._format._manifest import Manifest as Manifest
    from grain_rox._format._manifest import ShardRecord as ShardRecord
    from grain_rox._format._object_store import object_store_stats as object_store_stats
    from grain_rox._format._rox_corpus import RoxCorpus as RoxCorpus
    from grain_rox._format._rox_corpus import ShardInfo as ShardInfo
    from grain_rox._format._rox_corpus import open_rox as open_rox
    from grain_rox._format._rox_format import RoxFormatError as RoxFormatError
    from grain_rox._order._curriculum import Phase as Phase
    from grain_rox._pipeline._batch_source import GlobalBatchSource as GlobalBatchSource
    from grain_rox._pipeline._mixing import mix_datasets as mix_datasets
    from grain_rox._pipeline._packing import pack_documents as pack_documents
    from grain_rox._pipeline._packing import padding_efficiency as padding_efficiency
    from grain_rox._pipeline._pipeline import TokenPipeline as TokenPipeline
    from grain_rox._roxxel._roxxel_stream import roxxel_stream as roxxel_stream
    from grain_rox._sources._array_record import ArrayRecordSource as ArrayRecordSource
    from grain_rox._sources._array_record_export import export_array_record as export_array_record
    from grain_rox._sources._batches import shuffled_batches as shuffled_batches
    from grain_rox._sources._hf_source import HFEagerSource as HFEagerSource
    from grain_rox._sources._hf_stream import HFStreamingSource as HFStreamingSource
    from grain_rox._sources._numpy_source import NumpySource as NumpySource
    from grain_rox._sources._rox_documents import RoxDocumentSource as RoxDocumentSource
    from grain_rox._sources._rox_source import RoxBlockSource as RoxBlockSource
    from grain_rox._sources._rox_source import RoxTokenSource as RoxTokenSource
    from grain_rox._sources._segments import unpack_windows as unpack_windows
    from grain_rox._text._builtin_corpus import builtin_documents as builtin_documents
    from grain_rox._text._convert import read_documents as read_documents
    from grain_rox._text._document_readers import ReadStats as ReadStats
    from grain_rox._text._hf_tokenizer import HFTokenizer as HFTokenizer
    from grain_rox._text._rox_writer import WriteResult as WriteResult
    from grain_rox._text._rox_writer import write_rox as write_rox
    from grain_rox._text._tiktoken import TiktokenTokenizer as TiktokenTokenizer
    from grain_rox._text._tokenizers import ByteTokenizer as ByteTokenizer
    from grain_rox._text._tokenizers import Tokenizer as Tokenizer
    from grain_rox._text._tokenizers import get_tokenizer as get_tokenizer


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use, so writing and reading shards stay light."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'grain_rox' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
