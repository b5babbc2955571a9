"""distrain: config-driven distributed training for TensorFlow."""
import os

# Keras 3 has no ParameterServerStrategy support, so tf.keras must be Keras 2 (tf_keras).
# This must happen before TensorFlow is imported anywhere; importing the package does it.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TensorFlow's INFO chatter

__version__ = "0.1.0"
