"""What training measures: the loss and the metrics the config names (tf_keras classes by `_target_`),
and the sums that carry them across replicas, workers and checkpoints (Tally).

A Keras metric is a few state variables that only ever grow by sums (a mean's total and count, a
precision's true and false positives, an AUC's confusion counts) and a result computed from them. A
training step here returns each metric's growth for its batch instead of updating variables: the
sums of every replica and worker add up to the state of the whole epoch, and the result is computed
once from that, as one metric seeing every example would (never an average of averages)."""
import copy

import tensorflow as tf
import tf_keras as keras
from omegaconf import OmegaConf

from distrain.common.errors import ConfigError
from distrain.config.schema import ACCURACY, labels_read
from distrain.config.targets import takes as arguments
from distrain.config.validate import instantiate_as, reason


def make_loss(node, probabilities: bool, reduction: str = "none", plain: bool = False):
    """The config's loss, of float32 outputs (a 16-bit output is cast first, as mixed precision wants).
    from_logits=auto: as the model's last activation says (softmax or sigmoid: probabilities).
    plain: the Keras loss itself (what a saved model is compiled with, to load without distrain)."""
    if node.get("from_logits") == "auto":
        node = OmegaConf.merge(node, {"from_logits": not probabilities})
    loss = instantiate_as("loss._target_", node, keras.losses.Loss, "it must name a tf_keras loss class (or a function "
                          "returning one) taking the loss node's other keys", "a tf_keras loss: name a tf_keras.losses "
                          "class, or wrap a function in tf_keras.losses.LossFunctionWrapper", drop=("name",),
                          reduction=reduction)
    return loss if plain else Float32(loss, reduction)


@keras.saving.register_keras_serializable(package="distrain")
class Float32(keras.losses.Loss):
    """A Keras loss of float32 outputs."""

    def __init__(self, loss, reduction="auto", name=None):
        if isinstance(loss, dict):
            loss = keras.losses.deserialize(loss)
        super().__init__(reduction=reduction, name=name or loss.name)
        self.loss = loss

    def call(self, y_true, y_pred):
        return self.loss.call(y_true, tf.cast(y_pred, tf.float32))

    def get_config(self):
        return {**super().get_config(), "loss": keras.losses.serialize(self.loss)}


class Float32Metric(keras.metrics.Metric):
    """A Keras metric given float32 outputs, for evaluate(): as the training steps give them (a 16-bit
    output under mixed precision is cast first; some metrics cannot take one, R2Score say)."""

    def __init__(self, metric):
        super().__init__(name=metric.name, dtype=metric.dtype)
        self.metric = metric

    def update_state(self, y_true, y_pred, sample_weight=None):
        if y_true.dtype.is_floating:  # (Keras casts float labels to the outputs' type before metrics)
            y_true = tf.cast(y_true, tf.float32)
        # (the class's own methods: the instance's are Keras's wrappers, which read replicas' values once)
        return type(self.metric).update_state(self.metric, y_true, tf.cast(y_pred, tf.float32), sample_weight)

    def result(self):
        return type(self.metric).result(self.metric)

    def reset_state(self):
        self.metric.reset_state()


def check_labels(node, labels) -> None:
    """Labels a built-in cross-entropy would misread without an error: class indices given to the
    one-hot loss (a model of one output, whose softmax is always 1), or labels outside [0, 1] to the
    binary one (its loss goes negative, and training follows it)."""
    reads = labels_read(node)
    if reads == "one_hot" and (labels.ndim != 2 or labels.shape[1] < 2):
        raise ConfigError(f"loss=categorical_crossentropy reads one-hot label rows (N, classes), not labels of shape "
                          f"{labels.shape}: use loss=sparse_categorical_crossentropy for class indices")
    if reads == "binary" and labels.size and (labels.min() < 0 or labels.max() > 1):
        raise ConfigError(f"loss=binary_crossentropy reads labels from 0 to 1 (one per output), but these run from "
                          f"{labels.min():g} to {labels.max():g}: use loss=sparse_categorical_crossentropy for class "
                          "indices, or give rows of 0/1")


def check_loss(loss, labels, outputs, name: str, guessed: str = "") -> None:
    """The loss takes the model's outputs for these labels, one value per example; else a ConfigError.
    guessed: what the labels were taken for, where a loss of the user's did not say (data.labels_of)."""
    try:
        values = loss(tf.convert_to_tensor(labels), outputs)
        ok = tuple(values.shape) == (len(labels),)
    except Exception as exc:  # noqa: BLE001 - whatever the loss makes of them
        ok, why = False, f" ({reason(exc)})"
    else:
        why = f" (it gives values of shape {tuple(values.shape)}, not one per example)"
    if not ok:
        if guessed:  # the key that settles what they are
            raise ConfigError(f"loss={name} does not fit the model's outputs {tuple(outputs.shape)} and the labels "
                              f"{tuple(labels.shape)}{why}: a loss of your own does not say what its labels are, and "
                              f"these were taken for {KINDS[guessed]}; if they are class indices, set "
                              "data.num_classes=K (the model then gets K outputs)")
        raise ConfigError(f"loss={name} does not fit the model's outputs {tuple(outputs.shape)} and the labels "
                          f"{tuple(labels.shape)}{why}: give the model's last layer as many units as a label has "
                          "values (num_classes, which distrain passes to the builder), or choose the loss for these "
                          "labels")


KINDS = {"classes": "class indices", "one_hot": "one-hot label rows", "binary": "rows of 0/1 labels",
         "values": "values (regression)"}


def pick_accuracy(node, labels: str, probabilities: bool):
    """(The metrics node with each `auto` entry made the accuracy Keras's compile(metrics=["accuracy"])
    picks for these labels (schema.ACCURACY: none of values), a line saying what it picked, or ""). Binary
    accuracy of logits thresholds them at 0, a probability of 0.5 (Keras's own would read them as 0.5)."""
    picked, said = {}, []
    for name, entry in (node or {}).items():
        if entry != "auto":
            picked[name] = entry
            continue
        target = ACCURACY[labels]
        said.append(f"metrics.{name}: {target.rsplit('.', 1)[1] if target else 'none'} (auto: the labels are "
                    f"{KINDS[labels]}{'' if target else ', which have no accuracy'})")
        if target:
            picked[name] = {"_target_": target, **({"threshold": 0.0} if labels == "binary" and not probabilities
                                                   else {})}
    return OmegaConf.create(picked), "; ".join(said)


def make_metrics(node) -> dict:
    """{name: a new tf_keras Metric} for the config's metrics node, in its order; each named by its entry
    (as Keras's evaluate reports it) unless the entry names it."""
    metrics = {}
    for name, entry in (node or {}).items():  # (each a _target_ and its arguments: checking.check_entries)
        extra = {} if "name" in entry else {"name": str(name)}
        metrics[str(name)] = instantiate_as(
            f"metrics.{name}._target_", entry, keras.metrics.Metric, "it must name a tf_keras metric class taking "
            "the entry's other keys", "a tf_keras metric: name a tf_keras.metrics class, or wrap a function of "
            "(y_true, y_pred) in tf_keras.metrics.MeanMetricWrapper", **extra)
    return metrics


def check_metrics_read_the_outputs(node, probabilities: bool) -> None:
    """A metric of probabilities (AUC, binary accuracy, precision at 0.5, ...) given a model's logits
    measures nonsense without an error: one line saying which, and the argument that fits logits."""
    if probabilities:
        return
    for name, entry in (node or {}).items():
        takes = arguments(entry._target_) or set()
        if "from_logits" in takes:
            if entry.get("from_logits"):
                continue
            fix = f"metrics.{name}.from_logits=true" if "from_logits" in entry else f"+metrics.{name}.from_logits=true"
        elif {"threshold", "thresholds"} & takes and "F1Score" not in entry._target_ and "FBeta" not in entry._target_:
            key = "threshold" if "threshold" in takes else "thresholds"
            if entry.get(key) is not None:
                continue
            fix = f"+metrics.{name}.{key}=0 (a logit of 0 is a probability of 0.5)"
        else:
            continue
        raise ConfigError(f"metrics.{name} ({entry._target_}) reads probabilities, but the model outputs logits (its "
                          f"last layer has no sigmoid or softmax): set {fix}, or give the model a sigmoid output")


class _Growth:
    """Stands for a metric's state variable while the metric takes a batch: it adds up what the metric
    adds to the variable (assign_add) and reads as that sum."""

    def __init__(self, variable):
        self.shape, self.dtype = variable.shape, variable.dtype
        self.total = tf.zeros(variable.shape, variable.dtype)

    def assign_add(self, value, *args, **kwargs):
        self.total = self.total + tf.cast(value, self.dtype)
        return self.total

    def assign(self, value, *args, **kwargs):
        raise NotSummable()


class NotSummable(Exception):
    """A metric whose state is not only added to."""


tf.register_tensor_conversion_function(_Growth, lambda growth, dtype=None, name=None, as_ref=False: growth.total)


@tf.autograph.experimental.do_not_convert  # (no user code, no branch on a tensor: nothing to convert)
def _state(metric) -> list:
    """The metric's state variables, as (attribute name, variable), in a fixed order."""
    return sorted((name, value) for name, value in vars(metric).items() if isinstance(value, tf.Variable))


def growth(metric, labels, outputs) -> list:
    """What one batch adds to each of the metric's state variables (tensors, in _state's order)."""
    shadow = copy.copy(metric)  # the same metric, with stand-ins for its variables
    stand_ins = []
    for name, variable in _state(metric):
        stand_ins.append(_Growth(variable))
        object.__setattr__(shadow, name, stand_ins[-1])
    type(metric).update_state(shadow, labels, outputs)  # the class's own, unwrapped (not bound to `metric`)
    return [stand_in.total for stand_in in stand_ins]


class Tally:
    """The sums an epoch keeps: [the loss of every example, each metric's state variables flattened,
    the examples]. `add` gives a batch's; `values` turns sums into the loss per example and each
    metric's result."""

    def __init__(self, metrics: dict, labels, outputs):
        """metrics: make_metrics(); labels, outputs: a sample batch, to build each metric and check that
        it can be summed (a ConfigError names one that cannot)."""
        self.metrics = metrics
        # Autograph converts the metrics' own code (a user's metric may branch on tensors), as Keras's fit
        # does; the training step that calls `add` is not converted (runners.make_train_steps).
        self.growth = tf.autograph.to_graph(growth)
        for name, metric in metrics.items():
            try:
                metric.update_state(labels, outputs)  # builds a metric that makes its variables lazily
                metric.reset_state()
                tf.function(lambda y, p, m=metric: self.growth(m, y, p), autograph=False)(labels, outputs)
            except NotSummable:
                raise ConfigError(f"metrics.{name} ({type(metric).__name__}) keeps a state that is not a sum, which "
                                  "cannot be added up across replicas and workers: use another metric") from None
            except Exception as exc:  # noqa: BLE001 - whatever the metric makes of these labels and outputs
                raise ConfigError(f"metrics.{name} ({type(metric).__name__}) does not take labels of shape "
                                  f"{tuple(labels.shape)} and outputs of shape {tuple(outputs.shape)} ({reason(exc)}): "
                                  "use a metric for these labels (metrics=... in `python train.py --help`)") from None
        self.shapes = {name: [v.shape for _, v in _state(m)] for name, m in metrics.items()}
        self.size = 2 + sum(int(s.num_elements()) for shapes in self.shapes.values() for s in shapes)
        self.names = ["loss", *metrics]

    def add(self, labels, outputs, losses):
        """A batch's sums, one vector (float32)."""
        parts = [tf.reshape(tf.reduce_sum(tf.cast(losses, tf.float32)), [1])]
        for metric in self.metrics.values():
            parts += [tf.reshape(tf.cast(g, tf.float32), [-1]) for g in self.growth(metric, labels, outputs)]
        parts.append(tf.reshape(tf.cast(tf.shape(labels)[0], tf.float32), [1]))
        return tf.concat(parts, 0)

    def values(self, totals) -> list:
        """[(name, value)]: the loss per example, and each metric's result from its summed state."""
        totals = [float(v) for v in totals]
        found, at = [("loss", totals[0] / totals[-1] if totals[-1] else float("nan"))], 1
        for name, metric in self.metrics.items():
            for (_, variable), shape in zip(_state(metric), self.shapes[name]):
                n = int(shape.num_elements())
                variable.assign(tf.reshape(tf.cast(tf.constant(totals[at:at + n]), variable.dtype), shape))
                at += n
            result = metric.result()
            found.append((name, float(tf.reduce_mean(tf.cast(result, tf.float32)))))  # (per-class: their mean)
            metric.reset_state()
        return found
