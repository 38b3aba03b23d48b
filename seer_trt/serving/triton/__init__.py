"""Triton Inference Server model repositories for the Seer pipeline (docs/DESIGN.md "Serving and embedding").

In:  an export folder (``seer-export``, optionally ``seer-build``).
Out: a model repository: an orchestrator model (Python backend, BLS) that runs ``seer_trt.runtime.engine`` (seer-serve's
     engine) over the pipeline and calls one component model per graph (embed, vision, step zero, denoise).

    client ─► seer (orchestrator: Engine over a BLS backend) ─► seer_embed, seer_vision,
                                                                      seer_step_zero, seer_denoise, ...

Modules: ``repository`` plans and writes a repository (``seer-triton``), ``pbtxt`` renders and checks the
``config.pbtxt`` files, ``orchestrator`` and ``component`` are what the Python-backend models run inside the
server, ``local`` installs and starts the ``tritonserver`` binary bundled in ``nvidia-pytriton`` on loopback.
Importing this package imports nothing heavy.
"""
