"""Step profiles that answer for any size without torch, and where they are stored.

``scalable``: the ``ScalableProfile`` type (a traced step as exact polynomials of batch size
and sequence length), its file format and the polynomial machinery; ``stored``: the profiles
that named workloads ship, found by key. Below ``estimate/``, ``workloads/`` and ``trace/``:
imports only ``schema``, ``errors``, ``files`` and numpy.
"""
