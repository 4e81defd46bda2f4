"""slhub-mlflow: MLflow logging for slhub runs.

Install the distribution and list it in a recipe's extra plugins: ``plugins: [mlflow]``.
``python -m slhub_mlflow.sync RUN_DIR`` fills the MLflow run from the run's metrics.jsonl.
"""

__version__ = "0.1.0"
