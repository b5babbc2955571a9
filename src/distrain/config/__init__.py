"""The config: its schema (every key), the checks on a composed config, what a `_target_` takes.
No TensorFlow."""
