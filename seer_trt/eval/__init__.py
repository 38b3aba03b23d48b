"""Evaluation: the fixture task, accuracy of every mode, cache fidelity and report writing. Imports the runtime."""
