"""Contracts: what an export folder is and what every other layer agrees on. Imports nothing else of seer_trt.

Errors, configurations (generation, Seer, special tokens) and policies (prompt K/V cache, dispatch), the graph I/O
table, length buckets and engine profiles, the manifest and its checksums, image geometry, the ``Backend``
protocol, and which output folders seer-trt owns.
"""
