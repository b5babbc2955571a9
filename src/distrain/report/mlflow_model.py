"""The code of a run's MLflow model (tracking.py logs it as a pyfunc model "from code", with the run's
SavedModel as its artifact): MLflow runs this file when the model is loaded, and it needs only MLflow,
TensorFlow and tf-keras, not distrain. `mlflow.pyfunc.load_model(uri).predict(x)` gives what the Keras
model's predict gives (logits or probabilities, as results.json's model_outputs says)."""
import mlflow.pyfunc
import numpy as np
from mlflow.models import set_model


class SavedKerasModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import os

        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2, as the run saved it
        import tf_keras

        self.model = tf_keras.models.load_model(context.artifacts["saved_model"], compile=False)

    def predict(self, context, model_input: np.ndarray, params=None):  # (a hint MLflow takes as it is)
        return np.asarray(self.model.predict(np.asarray(model_input, dtype="float32"), verbose=0))


set_model(SavedKerasModel())
