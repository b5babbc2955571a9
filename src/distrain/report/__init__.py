"""What a run and a sweep tell: results.json and the closing lines, the time split, plots,
TensorBoard's HParams, a sweep's summary. No TensorFlow."""
