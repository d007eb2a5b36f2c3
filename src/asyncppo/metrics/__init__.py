"""Layer 1: metric sinks (console, JSONL, TensorBoard, W&B, MLflow), the fan-out logger, plots, rollout dumps and
the run report.

`plots` and `report` (matplotlib) and `rollout_dump` are imported from their modules, so importing this package
stays cheap.
"""

from asyncppo.metrics.console import ConsoleProgress
from asyncppo.metrics.logger import MetricsLogger
from asyncppo.metrics.remote import MlflowSink, WandbSink
from asyncppo.metrics.sinks import ImageSink, JsonlSink, MetricsSink, TensorBoardSink, read_metrics_jsonl

__all__ = [
    "ConsoleProgress",
    "ImageSink",
    "JsonlSink",
    "MetricsLogger",
    "MetricsSink",
    "MlflowSink",
    "TensorBoardSink",
    "WandbSink",
    "read_metrics_jsonl",
]
