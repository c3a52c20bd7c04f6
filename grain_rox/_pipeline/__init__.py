"""TokenPipeline, packing, mix_datasets (the Grain side of mixing)."""
