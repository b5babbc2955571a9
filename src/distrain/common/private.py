"""Every private name of TensorFlow, tf_keras, TensorBoard, Hydra and MLflow that distrain uses, in one place, each with
why no public API does (tests/test_layout.py fails by name when an upgrade moves one, and no other module
imports `tensorflow.python`, `tf_keras.src` or a private attribute). `get(NAME)` imports it when called:
nothing is imported with this module, so either side may use it; TensorFlow's come in task processes only
(and the fork server, which pre-imports the task side)."""
import importlib

# name: (module, attribute or None for the module itself, who uses it and why no public API does)
PRIVATE = {
    "util_port": ("tensorflow.python.util._pywrap_util_port", None,
                  "task/setup.onednn_on: whether TensorFlow runs its oneDNN kernels; it has no public query"),
    "coordination_config": ("tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2", None,
                            "task/strategy.watch_heartbeats: the coordination service's heartbeat timeout "
                            "(cluster.peer_timeout), which MultiWorkerMirroredStrategy takes no setting for"),
    "multi_worker_util": ("tensorflow.python.distribute.multi_worker_util", None,
                          "task/strategy.watch_heartbeats: the service's leader, as the strategy picks it"),
    "eager_context": ("tensorflow.python.eager.context", None,
                      "task/strategy.watch_heartbeats: the service configured before the strategy starts it"),
    "default_save_signature": ("tf_keras.src.saving.legacy.saved_model.save_impl", "default_save_signature",
                               "task/training.save_model: Keras's own serving signature for a SavedModel saved "
                               "without per-layer traces (save_traces=False gives none)"),
    "autograph_converter": ("tensorflow.python.autograph.core.converter", None,
                            "launcher/forkserver.convert_ahead: the conversion options tf.function uses"),
    "autograph_api": ("tensorflow.python.autograph.impl.api", None,
                      "launcher/forkserver.convert_ahead: autograph's transpiler, whose cache the tasks share"),
    "functional_saver": ("tensorflow.python.checkpoint.functional_saver", None,
                         "launcher/forkserver.convert_ahead: a checkpoint's save function, converted ahead"),
    "signature_serialization": ("tensorflow.python.saved_model.signature_serialization", None,
                                "launcher/forkserver.convert_ahead: a SavedModel's signature wrapper"),
    "keras_model_class": ("tf_keras.src.engine.training", "Model",
                          "launcher/forkserver.convert_ahead: Model.make_test_function's inner function"),
    "keras_saving_utils": ("tf_keras.src.saving.legacy.saving_utils", None,
                           "launcher/forkserver.convert_ahead: the traced model call of a SavedModel"),
    "hydra_class": ("hydra._internal.hydra", "Hydra",
                    "cli._mode_from_presets_only: Hydra.get_mode composes the whole config to read hydra.mode, "
                    "which hydra.main offers no way to skip where no option can set it"),
    "hydra_basic_launcher": ("hydra._internal.core_plugins.basic_launcher", "BasicLauncher",
                             "hydra_plugins/distrain_optuna_sweeper: a launcher that runs its jobs one at a time "
                             "in the sweep's process, which Hydra's Launcher interface does not say"),
    "mlflow_requirements_map": ("mlflow.utils.requirements_utils", "_init_modules_to_packages_map",
                                "report/tracking.Beside: MLflow's map of installed packages (1 s), which log_model "
                                "builds to check the model's pinned requirements; made while the tasks train"),
    "hparams_summary_pb": ("tensorboard.plugins.hparams.summary_v2", "_summary_pb",
                           "report/dashboard: an HParams session's end, which the public API does not write"),
}


def get(name: str):
    """The private module or attribute PRIVATE names, imported now."""
    module, attribute, _ = PRIVATE[name]
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found
