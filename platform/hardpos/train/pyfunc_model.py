"""MLflow "models from code" entry for the HardPos pyfunc (see hardpos.mlflow_model).

MLflow copies this file into the logged model and runs it when the model is loaded; it
is never imported by HardPos itself (importing it registers the model with MLflow).
"""
import mlflow

from hardpos.mlflow_model import _pyfunc_class

mlflow.models.set_model(_pyfunc_class()())
