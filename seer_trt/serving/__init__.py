"""Serving: the Triton repository and its models, and the C++ runtime's Python handle. Imports the runtime."""
