"""The code of a run's MLflow model (tracking.py logs it as a pyfunc model "from code", with the run's
SavedModel as its artifact): MLflow runs this file when the model is loaded, and it needs only MLflow,
TensorFlow and tf-keras, not distrain. `mlflow.pyfunc.load_model(uri).predict(x)` takes what the run's data
gave (uint8 images, scaled as training scaled them, with or without a channel axis of 1) or what the model
takes (floats), and gives what the Keras model's predict gives (logits or probabilities, as results.json's
model_outputs says): an array, or where the run named its classes a DataFrame with a column per class."""
import mlflow.pyfunc
import numpy as np
from mlflow.models import set_model


class SavedKerasModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import os
        from pathlib import Path

        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2, as the run saved it
        import tf_keras

        saved = Path(context.artifacts["saved_model"])
        self.model = tf_keras.models.load_model(str(saved), compile=False)
        names = saved / "class_names.txt"  # (rundir.CLASS_NAMES: this file runs without distrain)
        self.class_names = names.read_text().splitlines() if names.is_file() else None

    def predict(self, context, model_input: np.ndarray, params=None):  # (a hint MLflow takes as it is)
        x = np.asarray(model_input)
        x = x.astype("float32") / 255.0 if x.dtype == np.uint8 else x.astype("float32")  # (as training read them)
        shape = self.model.input_shape[1:]
        if x.ndim == len(shape) and shape[-1] == 1 and x.shape[1:] == tuple(shape[:-1]):
            x = x[..., None]  # images without their channel axis
        outputs = np.asarray(self.model.predict(x, verbose=0))
        if self.class_names and outputs.ndim == 2 and outputs.shape[1] == len(self.class_names):
            import pandas as pd

            return pd.DataFrame(outputs, columns=self.class_names)
        return outputs


set_model(SavedKerasModel())
