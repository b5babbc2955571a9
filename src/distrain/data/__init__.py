"""Data sources read without TensorFlow (arrays in memory, files scanned), the write-tfrecords
command, and the bundled MNIST digits (mnist-10k.npz)."""
