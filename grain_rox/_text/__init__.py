"""Text in: tokenizers, document readers (text/JSONL/Parquet/HF), the converter, the .rox writer, the embedded corpus."""
