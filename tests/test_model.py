import pytest
import tf_keras as keras

from distrain.common.errors import ConfigError
from distrain.task.model import build_model

from helpers import make_cfg


def test_mlp_is_the_classic_784_100_10_network():
    model = build_model(make_cfg("model=mlp").model, (28, 28, 1), 10)
    assert model.count_params() == 784 * 100 + 100 + 100 * 10 + 10 == 79_510
    assert [layer.__class__.__name__ for layer in model.layers] == ["InputLayer", "Flatten", "Dense", "Dense",
                                                                    "Activation"]


def test_cnn_is_the_keras_simple_mnist_convnet():
    model = build_model(make_cfg("model=cnn").model, (28, 28, 1), 10)
    assert model.count_params() == 34_826
    assert model.output_shape == (None, 10)


def test_logits_stay_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(make_cfg().model, (28, 28, 1), 10)
        assert model.layers[1].compute_dtype == "bfloat16"
        assert model.output.dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_builtin_models_take_any_image_shape_and_class_count():
    colour = build_model(make_cfg("model=mlp").model, (16, 16, 3), 5)
    assert colour.count_params() == 16 * 16 * 3 * 100 + 100 + 100 * 5 + 5
    assert build_model(make_cfg("model=cnn").model, (8, 8, 1), 3).output_shape == (None, 3)  # small images too
    with pytest.raises(ConfigError, match=r"model=cnn needs images of at least 5x5 pixels.*use model=mlp"):
        build_model(make_cfg("model=cnn").model, (4, 4, 1), 3)
