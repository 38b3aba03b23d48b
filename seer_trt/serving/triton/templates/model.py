"""Triton Python-backend entry of a seer-triton model (generated; regenerate with seer-triton rather than editing).

In:  the model's config (its ``seer_role`` parameter: "orchestrator" or "component"; ``seer_trt_path``: where
     the generating seer_trt lives), then batches of requests.
Out: one response per request, from ``seer_trt.serving.triton.<role>.Model``.

The backend's stub ignores PYTHONPATH, so the folder holding ``seer_trt`` is put on ``sys.path`` here when it
exists on this machine; elsewhere (a container) seer_trt must be installed in the server's Python.
"""

import importlib
import json
import sys
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = params.get("seer_trt_path", "")
        if path and (Path(path) / "seer_trt" / "__init__.py").is_file() and path not in sys.path:
            sys.path.insert(0, path)
        try:
            module = importlib.import_module(f"seer_trt.serving.triton.{params['seer_role']}")
        except ImportError as err:
            raise RuntimeError(
                f"seer_trt cannot be imported in the server's Python ({err}); pip install seer-trt there, or "
                f"regenerate the repository with seer-triton on this machine"
            ) from None
        self.model = module.Model(args, config)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
