"""The launcher side: starts a run's task processes, supervises them, restarts what may be restarted.
Never imports TensorFlow."""
