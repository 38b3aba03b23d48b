"""What an ONNX Runtime session of the runtime was opened with."""

from __future__ import annotations


def prepacks(backend, graph: str) -> bool:
    """Whether ``backend``'s session of ``graph`` packs its MatMul weights (``session.disable_prepacking`` unset)."""
    options = backend._session(graph).get_session_options()
    try:
        return options.get_session_config_entry("session.disable_prepacking") != "1"
    except Exception:  # onnxruntime raises when the entry was never set: the default, prepacking on
        return True
