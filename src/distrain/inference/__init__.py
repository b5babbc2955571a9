"""`distrain evaluate` and `distrain predict`: a trained model on test or new data, in this process
or on a local cluster's tasks. TensorFlow only inside the functions that run the model."""
