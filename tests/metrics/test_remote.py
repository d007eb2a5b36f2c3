"""W&B and MLflow sinks: the friendly missing-package error, and their calls against fake client modules."""

import re
import sys
import types
from typing import ClassVar

import pytest

from asyncppo.metrics import MlflowSink, WandbSink


@pytest.mark.parametrize(
    ("module", "build", "extra"),
    [
        ("wandb", lambda tmp_path: WandbSink("project", "run", None, {}), "asyncppo[wandb]"),
        ("mlflow", lambda tmp_path: MlflowSink("experiment", None, tmp_path), "asyncppo[mlflow]"),
    ],
)
def test_a_missing_package_names_the_extra_to_install(monkeypatch, tmp_path, module, build, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail even where it is installed
    with pytest.raises(ImportError, match=re.escape(f"install {extra}")):
        build(tmp_path)


class FakeWandbRun:
    def __init__(self, **init_args):
        self.init_args = init_args
        self.id = "run-123"
        self.logged: list[tuple[dict, int]] = []
        self.finished = False

    def log(self, data, step):
        self.logged.append((data, step))

    def finish(self):
        self.finished = True


class FakeImage:
    def __init__(self, path):
        self.path = path


def test_wandb_sink_logs_floats_images_and_finishes(monkeypatch, tmp_path):
    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: runs.append(FakeWandbRun(**kwargs)) or runs[-1]  # pyright: ignore[reportAttributeAccessIssue]
    fake.Image = FakeImage  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sink = WandbSink("proj", "name", "team", {"ppo": {"ppo_epochs": 2}}, run_id="run-123")
    (run,) = runs
    assert run.init_args == {
        "project": "proj",
        "name": "name",
        "entity": "team",
        "config": {"ppo": {"ppo_epochs": 2}},
        "id": "run-123",
        "resume": "allow",
    }
    sink.log(3, {"train/loss": 1})
    sink.log_image(3, "mismatch/plot", tmp_path / "p.png")
    sink.close()
    assert run.logged[0] == ({"train/loss": 1.0}, 3)
    image_data, image_step = run.logged[1]
    assert image_step == 3
    assert image_data["mismatch/plot"].path == str(tmp_path / "p.png")
    assert run.finished
    assert sink.run_id == "run-123"


class FakeMlflowClient:
    instances: ClassVar[list["FakeMlflowClient"]] = []

    def __init__(self, tracking_uri):
        self.tracking_uri = tracking_uri
        self.calls: list[tuple] = []
        FakeMlflowClient.instances.append(self)

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name):
        self.calls.append(("create_experiment", name))
        return "exp-1"

    def create_run(self, experiment_id, run_name, tags):
        self.calls.append(("create_run", experiment_id, run_name))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id, metrics):
        self.calls.append(("log_batch", run_id, len(metrics)))

    def log_artifact(self, run_id, path, artifact_path):
        self.calls.append(("log_artifact", run_id, path, artifact_path))

    def set_terminated(self, run_id):
        self.calls.append(("set_terminated", run_id))


def test_mlflow_sink_batches_metrics_and_stores_images_as_artifacts(monkeypatch, tmp_path):
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = FakeMlflowClient  # pyright: ignore[reportAttributeAccessIssue]
    entities = types.ModuleType("mlflow.entities")
    entities.Metric = lambda key, value, timestamp, step: (key, value, step)  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setitem(sys.modules, "mlflow", types.ModuleType("mlflow"))
    monkeypatch.setitem(sys.modules, "mlflow.tracking", tracking)
    monkeypatch.setitem(sys.modules, "mlflow.entities", entities)
    FakeMlflowClient.instances.clear()
    sink = MlflowSink("asyncppo", None, tmp_path / "run7")
    sink.log(2, {f"m/{i}": float(i) for i in range(1500)})  # above MLflow's 1000-metrics-per-call limit
    sink.log_image(2, "mismatch/plot", tmp_path / "p.png")
    sink.close()
    (client,) = FakeMlflowClient.instances
    assert client.tracking_uri == (tmp_path / "run7" / "mlruns").resolve().as_uri()
    assert client.calls == [
        ("create_experiment", "asyncppo"),
        ("create_run", "exp-1", "run7"),
        ("log_batch", "r1", 1000),
        ("log_batch", "r1", 500),
        ("log_artifact", "r1", str(tmp_path / "p.png"), "mismatch/plot/step_2"),
        ("set_terminated", "r1"),
    ]
