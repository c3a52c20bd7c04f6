"""Grain sources: .rox token/block/document, HF eager/streaming, ArrayRecord, NumPy, the shared batch reader."""
