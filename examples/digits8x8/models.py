"""A model builder for distrain: it gets the data's image shape and class count, and returns an
uncompiled tf_keras model whose last layer gives logits (or a softmax: distrain notices either)."""
import tf_keras as keras


def small_cnn(input_shape, num_classes, width=32, dropout=0.25):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(2 * width, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(num_classes),
    ], name="small_cnn")
