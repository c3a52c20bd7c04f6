"""Apache Beam conversion (the ``[beam]`` extra); the public face is :mod:`grain_rox.beam`."""
