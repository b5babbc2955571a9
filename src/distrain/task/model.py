"""The model every strategy trains: a builder named by the config's `_target_` (the built-in `cnn` and
`mlp` below, or a user's own), or a saved Keras model (model.path); its loss, optimizer and checks."""
import tensorflow as tf
import tf_keras as keras
from omegaconf import OmegaConf

from distrain.common.errors import ConfigError
from distrain.config.validate import instantiate, reason


def cnn(input_shape, num_classes: int, dropout: float = 0.5, name: str = "cnn") -> keras.Model:
    """The Keras "simple MNIST convnet" (34,826 parameters on MNIST), for any image shape of at least 5x5."""
    if min(input_shape[:2]) < 5:
        raise ValueError(f"model=cnn needs images of at least 5x5 pixels, not {tuple(input_shape)}: use model=mlp")
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for filters in (32, 64):
        x = keras.layers.Conv2D(filters, 3, activation="relu")(x)
        if min(x.shape[1:3]) >= 2:  # small images (8x8) keep their last pixels
            x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(dropout)(x)
    return _with_logits(inputs, keras.layers.Dense(num_classes)(x), name)


def mlp(input_shape, num_classes: int, hidden_units: int = 100, name: str = "mlp") -> keras.Model:
    """The classic distributed-MNIST network: pixels -> hidden ReLU -> logits (79,510 parameters on MNIST)."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Dense(hidden_units, activation="relu")(keras.layers.Flatten()(inputs))
    return _with_logits(inputs, keras.layers.Dense(num_classes)(x), name)


def _with_logits(inputs, x, name: str) -> keras.Model:
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)  # float32 under mixed precision
    return keras.Model(inputs, logits, name=name)


# Keys of a model node that are distrain's, not the builder's.
OWN_KEYS = ("path",)


def build_model(node, input_shape, num_classes: int) -> keras.Model:
    """The config's model node, built for images of `input_shape` (with a channel axis) and
    `num_classes` classes: `hydra.utils.instantiate(node, input_shape=..., num_classes=...)`, or the
    Keras model saved at node.path. Call it inside strategy.scope(). A builder that fails, or returns
    something else than a Keras model, is a ConfigError."""
    path = node.get("path")
    if path:
        what = f"model.path={path}"
        try:
            model = keras.models.load_model(path, compile=False)
        except (ImportError, OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"{what} could not be loaded ({reason(exc)}): point model.path at a .keras file or "
                              "SavedModel directory (a run's saved_model)") from None
    else:
        what = f"model._target_={node._target_}"
        model = instantiate("model._target_", OmegaConf.masked_copy(node, [k for k in node if k not in OWN_KEYS]),
                            "it must name a function module.name importable from this directory or PYTHONPATH, "
                            "taking input_shape, num_classes and the model node's other keys",
                            input_shape=tuple(input_shape), num_classes=num_classes)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{what} returned {type(model).__name__}, not a tf_keras.Model: return an uncompiled "
                          "tf_keras.Model (import tf_keras as keras; not keras 3)")
    return model


def check_model(model: keras.Model, images, num_classes: int, class_indices: bool = True) -> bool:
    """One forward pass on a few examples: the model takes these images and gives num_classes outputs.
    Returns whether its outputs are probabilities (a softmax output layer) rather than logits.
    class_indices=False (a loss of other labels): the outputs' shape is the loss's to check (check_loss), and
    a softmax or sigmoid last activation means probabilities."""
    sample = images[:2]
    try:
        outputs = model(tf.convert_to_tensor(sample), training=False)
    except Exception as exc:  # noqa: BLE001 - any failure here is "does not take these images"
        raise ConfigError(f"model {model.name} does not take images of shape {tuple(sample.shape[1:])} "
                          f"({reason(exc)}): build it for input_shape, which distrain passes to the builder") \
            from None
    if not class_indices and isinstance(outputs, tf.Tensor):
        return _last_activation(model) in ("softmax", "sigmoid")
    if not isinstance(outputs, tf.Tensor) or tuple(outputs.shape) != (len(sample), num_classes):
        shape = tuple(outputs.shape) if isinstance(outputs, tf.Tensor) else type(outputs).__name__
        raise ConfigError(f"model {model.name} outputs {shape} for a batch of {len(sample)}, not ({len(sample)}, "
                          f"{num_classes}): its last layer must have num_classes={num_classes} units (set "
                          "data.num_classes if the data's labels do not show every class)")
    return _outputs_probabilities(model, outputs)


def _last_activation(model: keras.Model) -> str:
    """The activation of a functional or Sequential model's last layer ("softmax" for a Softmax layer)."""
    if not getattr(model, "_is_graph_network", False):
        return ""
    last = model.layers[-1]
    return "softmax" if isinstance(last, keras.layers.Softmax) else \
        getattr(getattr(last, "activation", None), "__name__", "")


def _outputs_probabilities(model: keras.Model, outputs) -> bool:
    """Softmax in the last layer (common in Keras code) means probabilities, not logits. A sigmoid there
    would train a multi-class model wrongly whichever loss we chose, so it is refused."""
    activation = _last_activation(model)  # functional or Sequential: the last layer is the output
    if activation == "softmax":
        return True
    if activation == "sigmoid":
        raise ConfigError(f"model {model.name} ends with a sigmoid: give its last layer no activation (logits) or "
                          "softmax, as a classifier of integer labels needs (multi-label rows of 0/1: "
                          "loss=binary_crossentropy metrics=binary)")
    if activation:
        return False  # logits, the norm
    # A subclassed model's last layer need not be its last operation (nor need a last layer without an
    # activation): probabilities are non-negative rows summing to 1.
    # Rows of a 16-bit softmax (mixed precision: bfloat16 keeps 8 bits) sum to 1 only within about 1%.
    tolerance = 1e-3 if outputs.dtype.size >= 4 else 2e-2
    rows = tf.reduce_sum(tf.cast(outputs, tf.float32), axis=-1)
    return bool(tf.reduce_all(outputs >= 0) and tf.reduce_all(tf.abs(rows - 1.0) < tolerance))


def compile_model(model: keras.Model, optimizer, cfg, probabilities: bool = False, plain: bool = False) -> None:
    """For evaluate(), and so that a SavedModel can train on, with the config's loss and metrics. plain:
    Keras's own loss, which a process without distrain can load (evaluate's casts a 16-bit output to
    float32 first)."""
    from distrain.task.metrics import Float32Metric, make_loss, make_metrics

    with model.distribute_strategy.scope():  # Keras wants a model's metrics made where its variables were
        metrics = [m if plain else Float32Metric(m) for m in make_metrics(cfg.get("metrics")).values()]
    model.compile(
        optimizer=optimizer,
        loss=make_loss(cfg.loss, probabilities, reduction="auto", plain=plain),
        metrics=metrics,
        steps_per_execution=cfg.trainer.steps_per_execution,
        jit_compile=False,  # evaluation only: XLA cannot compile its metric all-reduces on CPUs
    )


def rebuilt_from_config(model: keras.Model) -> bool:
    """Whether plain Keras rebuilds the model from its config alone: a Sequential or functional model of
    Keras's own objects (layers, activations, initializers, regularizers, ...; nothing of the user's,
    registered or not, and no Lambda). Its SavedModel then needs no traced function per layer, which a
    model with code of the user's needs to load without that code."""
    def keras_own(node) -> bool:
        if isinstance(node, dict):  # an object Keras serialised names its class; Keras's own, its module too
            own = "class_name" not in node or (str(node.get("module")).startswith("keras")
                                               and node.get("registered_name") is None)
            return own and all(map(keras_own, node.values()))
        return all(map(keras_own, node)) if isinstance(node, (list, tuple)) else True

    if not getattr(model, "_is_graph_network", False):  # (a subclassed model's config is its own)
        return False
    try:
        return keras_own(model.get_config())
    except Exception:  # noqa: BLE001 - a config Keras cannot give: the traces then
        return False
