"""A model builder for distrain: it gets one row's shape and the label's size (1: one number to
predict), and returns an uncompiled tf_keras model with a linear output."""
import tf_keras as keras


def regressor(input_shape, num_classes, width=32, dropout=0.1, l2=1e-3):
    penalty = keras.regularizers.L2(l2)  # distrain adds the layers' penalties to the loss, as fit does
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Dense(width, activation="relu", kernel_regularizer=penalty),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(width, activation="relu", kernel_regularizer=penalty),
        keras.layers.Dense(num_classes, dtype="float32"),  # float32 outputs under mixed precision, as Keras advises
    ], name="regressor")
