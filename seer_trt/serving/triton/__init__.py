"""Triton Inference Server model repositories for the Seer pipeline (docs/DESIGN.md "Serving and embedding").

In:  an export folder (``seer-export``, optionally ``seer-build``).
Out: a model repository: by default one decoupled model (Python backend) whose one ``seer_trt.runtime.engine``
     (seer-serve's engine) runs the export in-process and streams; with ``--orchestration bls`` an orchestrator
     that runs the engine over a BLS backend calling one component model per graph (embed, vision, step zero, ...).

    client ─► seer (decoupled: one Engine over ONNX Runtime / TensorRT, in-process) ─► streamed responses
    client ─► seer (bls: Engine over a BLS backend) ─► seer_embed, seer_vision, seer_step_zero, seer_denoise, ...

Modules: ``repository`` plans and writes a repository (``seer-triton``), ``pbtxt`` renders and checks the
``config.pbtxt`` files, ``wire`` is the orchestrators' contract with clients, ``decoupled`` (the default),
``orchestrator`` (bls) and ``component`` are what the Python-backend models run inside the server, ``local``
installs and starts the ``tritonserver`` binary bundled in ``nvidia-pytriton`` on loopback.
Importing this package imports nothing heavy.
"""
