"""ONNX export: the graphs as torch modules, export options, the export itself, shared weights, parity, the run."""
