"""The ``mlflow:`` recipe section, and which tracking server it names."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field
from slhub import SlhubError

#: The recipe section the plugin owns (optional: every key has a default).
SECTION = "mlflow"
#: Where the tracking server is read from when the section names none.
URI_ENV = "MLFLOW_TRACKING_URI"


class MlflowSection(BaseModel):
    """``mlflow:`` in a recipe; omitted, the defaults apply."""

    model_config = ConfigDict(extra="forbid")

    #: The tracking server (``http://host:port``); None: ``$MLFLOW_TRACKING_URI``.
    tracking_uri: str | None = Field(default=None, min_length=1)
    #: The MLflow experiment the run goes into, created when absent.
    experiment: str = Field(default="slhub", min_length=1)
    #: The MLflow run's name; None: the name of ``trainer.output_dir``.
    run_name: str | None = Field(default=None, min_length=1)
    #: Extra tags of the MLflow run.
    tags: dict[str, str] = Field(default_factory=dict)
    #: Upload ``last.pt`` and ``best.pt`` as artifacts (``checkpoints/``) when the run ends.
    log_checkpoints: bool = False


def tracking_uri(section: MlflowSection, given: str | None = None) -> str:
    """The server to log to: ``given``, else the section's, else ``$MLFLOW_TRACKING_URI``;
    none of them is a mistake named in one line (an MLflow default would write ./mlruns)."""
    uri = given or section.tracking_uri or os.environ.get(URI_ENV, "").strip()
    if not uri:
        raise SlhubError(
            f"{SECTION}.tracking_uri: no MLflow tracking server named; set "
            f"{SECTION}.tracking_uri or {URI_ENV} (e.g. http://127.0.0.1:5000)"
        )
    return uri
