"""MLflow "models from code" entry for the HardPos pyfunc (see hardpos.models.pyfunc).

MLflow copies this file into the logged model and runs it when the model is loaded; it
is never imported by HardPos itself (importing it registers the model with MLflow).
"""
import mlflow

from hardpos.models.pyfunc import HardPosModel

mlflow.models.set_model(HardPosModel())
