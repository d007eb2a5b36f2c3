"""Optional remote sinks: Weights & Biases and MLflow (the `asyncppo[wandb]` / `asyncppo[mlflow]` extras).

Built by the driver only when enabled; each imports its package in its constructor, so asyncppo never needs
them installed. Hand them to `MetricsLogger` as best-effort sinks: a network failure must not kill a run.
"""

import importlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from asyncppo.metrics.sinks import metric_floats

# MLflow's log_batch accepts at most 1000 metrics per call.
_MLFLOW_BATCH_LIMIT = 1000


def import_optional(module: str, extra: str, user: str) -> ModuleType:
    """Import `module`, or raise ImportError telling the user which asyncppo extra installs it.

    Only a missing top-level package becomes the friendly error; a package that is installed but broken
    (a failing import inside it) keeps its own error, which is the one worth reading.
    """
    package = module.split(".")[0]
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as error:
        if error.name != package:
            raise
        raise ImportError(
            f"{user} needs the '{package}' package, which is not installed: install asyncppo[{extra}] "
            f"(pip install 'asyncppo[{extra}]')"
        ) from error
    return importlib.import_module(module)


class WandbSink:
    """Scalars and images to a W&B run. `run_id` continues an existing run (resume) instead of starting one."""

    def __init__(
        self,
        project: str,
        name: str | None,
        entity: str | None,
        config_dict: Mapping[str, Any] | None,
        *,
        run_id: str | None = None,
    ) -> None:
        self._wandb = import_optional("wandb", "wandb", "WandbSink")
        self._run = self._wandb.init(
            project=project,
            name=name,
            entity=entity,
            config=dict(config_dict) if config_dict is not None else None,
            id=run_id,
            resume="allow" if run_id is not None else None,
        )

    @property
    def run_id(self) -> str:
        """Save this with the run so that a resumed run keeps logging to the same W&B run."""
        return str(self._run.id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(metric_floats(metrics), step=step)

    def log_image(self, step: int, key: str, path: str | os.PathLike[str]) -> None:
        self._run.log({key: self._wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """Scalars and image artifacts to an MLflow run of `experiment_name` (created when missing).

    Talks through an `MlflowClient` rather than mlflow's module-level active run, so nothing global changes in
    the process. tracking_uri None stores the run in a local file store under `run_dir/mlruns`.
    """

    def __init__(self, experiment_name: str, tracking_uri: str | None, run_dir: str | os.PathLike[str]) -> None:
        tracking = import_optional("mlflow.tracking", "mlflow", "MlflowSink")
        self._entities = import_optional("mlflow.entities", "mlflow", "MlflowSink")
        run_path = Path(run_dir).resolve()
        uri = tracking_uri if tracking_uri is not None else (run_path / "mlruns").as_uri()
        self._client = tracking.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(experiment_name)
        experiment_id = (
            experiment.experiment_id if experiment is not None else self._client.create_experiment(experiment_name)
        )
        run = self._client.create_run(experiment_id, run_name=run_path.name, tags={"asyncppo.run_dir": str(run_path)})
        self.run_id: str = run.info.run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        timestamp_ms = int(time.time() * 1000)
        entries = [
            self._entities.Metric(key, value, timestamp_ms, step) for key, value in metric_floats(metrics).items()
        ]
        for start in range(0, len(entries), _MLFLOW_BATCH_LIMIT):
            self._client.log_batch(self.run_id, metrics=entries[start : start + _MLFLOW_BATCH_LIMIT])

    def log_image(self, step: int, key: str, path: str | os.PathLike[str]) -> None:
        self._client.log_artifact(self.run_id, str(path), artifact_path=f"{key}/step_{step}")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
