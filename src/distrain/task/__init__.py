"""The task side: one process per cluster task, with TensorFlow (`python -m distrain.task CONFIG`).
Only modules under this folder import TensorFlow when imported."""
