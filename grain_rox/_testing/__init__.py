"""Helpers behind grain_rox.testing."""
