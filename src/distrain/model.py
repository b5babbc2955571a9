"""The one MNIST model every strategy trains, and its optimizer."""
import tensorflow as tf
import tf_keras as keras


def hits(labels, logits):
    """1.0 where the highest logit is the label, else 0.0."""
    return tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)


def build_model(model) -> keras.Model:
    """`model` is the config's model node; logits out, float32 even under mixed precision."""
    inputs = keras.Input(shape=(28, 28, 1), name="image")
    if model.name == "cnn":  # the Keras "simple MNIST convnet"
        x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
        x = keras.layers.MaxPooling2D(2)(x)
        x = keras.layers.Conv2D(64, 3, activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dropout(model.dropout)(x)
    elif model.name == "mlp":  # the classic distributed-MNIST network
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(model.hidden_units, activation="relu")(x)
    else:
        raise ValueError(f"unknown model {model.name!r}")
    x = keras.layers.Dense(10)(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name=model.name)


def make_optimizer(name: str, learning_rate: float, policy: str = "float32"):
    optimizers = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}
    optimizer = optimizers[name](learning_rate=learning_rate)
    if policy == "mixed_float16":  # float16 gradients underflow without loss scaling
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def compile_model(model: keras.Model, optimizer, trainer) -> None:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=trainer.steps_per_execution,
        jit_compile=False,  # evaluation only: XLA cannot compile its metric all-reduces on CPUs
    )
