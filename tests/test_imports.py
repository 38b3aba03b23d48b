"""The runtime never imports torch, transformers or seer_export, in any of its sub-packages (docs/DESIGN.md "Layout
and dependency direction")."""

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "transformers", "seer_export", "onnx"}:
                raise ImportError(f"blocked heavy import: {name}")
            return None

    sys.meta_path.insert(0, Block())
    """
)


def test_runtime_imports_without_heavy_packages():
    code = BLOCKER + textwrap.dedent(
        """
        import pkgutil, importlib
        import numpy as np
        import seer_trt
        walked = [m.name for m in pkgutil.walk_packages(seer_trt.__path__, "seer_trt.")]
        for name in walked:
            importlib.import_module(name)
        # every layer's folder, and a module deep in each
        assert {"seer_trt.contracts", "seer_trt.backends", "seer_trt.runtime", "seer_trt.build", "seer_trt.serving",
                "seer_trt.serving.triton", "seer_trt.eval", "seer_trt.cli"} <= set(walked), walked
        assert {"seer_trt.backends.tensorrt", "seer_trt.serving.triton.orchestrator", "seer_trt.cli.run"} <= set(walked)
        from seer_trt.runtime.boundary import find_boundaries
        from seer_trt.runtime.schedule import plan_schedule
        from seer_trt.contracts.config import GenerationConfig
        from seer_trt.eval.tasks import make_samples
        s = np.zeros((1, 8)); s[0, 4:] = 0.5
        assert find_boundaries(s).tolist() == [6]
        assert plan_schedule(GenerationConfig(gen_length=8, steps=8, block_length=8)).transfer.sum() == 8
        assert len(make_samples(0, 3)) == 3
        assert not any(m.split(".")[0] in {"torch", "transformers", "seer_export"} for m in sys.modules)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
