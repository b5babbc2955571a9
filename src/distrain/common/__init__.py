"""What both sides use: errors, the run directory and its storage, the messages between the launcher
and its tasks, process lifetime, the CPU, the cluster spec, stack dumps. No TensorFlow."""
