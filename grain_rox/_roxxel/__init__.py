"""The bit-exact roxxel stream (migration)."""
