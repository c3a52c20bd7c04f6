"""MultiHostDataLoadIterator (placement, prefetch), iterator state, Orbax handlers."""
