import tf_keras as keras

from distrain.model import build_model
from conftest import make_cfg


def test_mlp_is_the_classic_784_100_10_network():
    model = build_model(make_cfg("model=mlp").model)
    assert model.count_params() == 784 * 100 + 100 + 100 * 10 + 10 == 79_510
    assert [l.__class__.__name__ for l in model.layers] == ["InputLayer", "Flatten", "Dense", "Dense", "Activation"]


def test_cnn_is_the_keras_simple_mnist_convnet():
    model = build_model(make_cfg("model=cnn").model)
    assert model.count_params() == 34_826
    assert model.output_shape == (None, 10)


def test_logits_stay_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(make_cfg().model)
        assert model.layers[1].compute_dtype == "bfloat16"
        assert model.output.dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")
