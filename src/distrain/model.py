"""The one MNIST model every strategy trains, and its optimizer."""
import tensorflow as tf
import tf_keras as keras


def hits(labels, logits):
    """1.0 where the highest logit is the label, else 0.0."""
    return tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)


class Model(keras.Model):
    """A Keras model whose training step, across workers, reports its own batch instead of metrics.

    Under MultiWorkerMirroredStrategy, reading a metric inside a step synchronises it across the
    workers: several small all-reduces every step, a third of the step time on CPUs. So there the
    step updates the metrics and reports this replica's batch loss and accuracy (the progress bar
    shows those mid-epoch); Keras reads the synchronised metrics once at the end of each epoch, so
    epoch lines and history are the global values. Elsewhere it is Keras's own step.
    """

    def train_step(self, data):
        if not isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return super().train_step(data)
        images, labels = data
        with tf.GradientTape() as tape:
            logits = self(images, training=True)
            loss = self.compute_loss(images, labels, logits)
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        self.compiled_metrics.update_state(labels, logits)
        return {"loss": tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)),
                "accuracy": tf.reduce_mean(hits(labels, logits))}


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
    return Model(inputs, logits, name=model.name)


def make_optimizer(name: str, learning_rate: float):
    optimizers = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}
    return optimizers[name](learning_rate=learning_rate)


def compile_model(model: keras.Model, optimizer, trainer) -> None:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=trainer.steps_per_execution,
        jit_compile=trainer.jit_compile,
    )
    if isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
        model.distribute_reduction_method = "first"  # step logs stay on the worker (see Model)
