"""The command line's helpers (``grain_rox.cli`` is the entry point)."""
