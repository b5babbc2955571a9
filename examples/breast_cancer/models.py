"""A model builder for distrain: it gets one row's shape and the label's size (1: one yes/no), and
returns an uncompiled tf_keras model whose output is a probability (a sigmoid: distrain's
binary cross-entropy reads it as one)."""
import tf_keras as keras


def classifier(input_shape, num_classes, width=16, dropout=0.2):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(num_classes, activation="sigmoid", dtype="float32"),  # float32 under mixed precision
    ], name="classifier")
