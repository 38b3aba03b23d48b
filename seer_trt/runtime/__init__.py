"""The runtime: one file per stage of a request, joined by ``pipeline``. Imports contracts and backends only.

A request walks one way: prompt ─► image ─► embed ─► step_zero ─► boundary ─► schedule ─► dispatch ─► layout
─► denoise (its kv_cache) ─► detokenize. The stages the C++ runtime also has keep the stems of ``cpp/src/``
(embed, step_zero, boundary, schedule, dispatch, layout, kv_cache, denoise, detokenize, pipeline); Python adds
``request``, ``prompt`` and ``image`` (the C++ runtime takes ready prompt ids and pixel tiles) and ``costs`` (the
cost model's timed calibration, which C++ keeps in ``dispatch.cpp``).
"""
