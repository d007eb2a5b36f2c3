"""JSONL and TensorBoard sinks: what lands on disk, non-finite values, resume truncation, cut-short lines."""

import json
import math

import pytest
import torch

from asyncppo.metrics import JsonlSink, TensorBoardSink, read_metrics_jsonl
from asyncppo.metrics.sinks import metric_floats


def test_jsonl_writes_one_flushed_object_per_step(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(1, {"train/loss": 0.5, "train/num_tokens": 12})
    # Readable before close: every line is flushed as it is written.
    assert path.read_text() == '{"step": 1, "train/loss": 0.5, "train/num_tokens": 12.0}\n'
    sink.log(2, {"train/loss": torch.tensor(0.25)})  # pyright: ignore[reportArgumentType]  # tensors are accepted
    sink.close()
    assert read_metrics_jsonl(path) == [
        {"step": 1, "train/loss": 0.5, "train/num_tokens": 12.0},
        {"step": 2, "train/loss": 0.25},
    ]


def test_non_finite_values_are_strings_on_disk_and_floats_when_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with_nan = {"a": math.nan, "b": math.inf, "c": -math.inf}
    sink = JsonlSink(path)
    sink.log(3, with_nan)
    sink.close()
    assert json.loads(path.read_text()) == {"step": 3, "a": "nan", "b": "inf", "c": "-inf"}
    (record,) = read_metrics_jsonl(path)
    assert math.isnan(record["a"])
    assert record["b"] == math.inf
    assert record["c"] == -math.inf


def test_bad_metrics_are_rejected_with_their_key(tmp_path):
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="'train/text'"):
        sink.log(1, {"train/text": "hello"})  # pyright: ignore[reportArgumentType]  # the point of the test
    with pytest.raises(ValueError, match="reserved"):
        sink.log(1, {"step": 1.0})
    sink.close()
    with pytest.raises(ValueError, match="'t'"):
        metric_floats({"t": torch.ones(2)})


def test_resume_drops_records_after_the_checkpoint_step_and_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    for step in range(1, 6):
        sink.log(step, {"x": float(step), "bad": math.nan})
    sink.close()
    # The crashed run logged steps 4-5 after the checkpoint of step 3; the resumed run logs them again.
    resumed = JsonlSink(path, truncate_after_step=3)
    resumed.log(4, {"x": 40.0})
    resumed.close()
    records = read_metrics_jsonl(path)
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    assert records[-1] == {"step": 4, "x": 40.0}
    assert math.isnan(records[0]["bad"])


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_line_starts_fresh(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    with pytest.warns(UserWarning, match="truncated last line"):
        assert read_metrics_jsonl(path) == [{"step": 1, "x": 1.0}]
    sink = JsonlSink(path)
    sink.log(2, {"x": 2.0})
    sink.close()
    lines = path.read_text().splitlines()
    assert lines[-1] == '{"step": 2, "x": 2.0}'
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=":2: not a JSON object"):
        read_metrics_jsonl(path)


def test_tensorboard_sink_writes_scalars_and_images(tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    image_path = tmp_path / "plot.png"
    Image.new("RGB", (8, 6), color=(255, 0, 0)).save(image_path)
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log(1, {"train/loss": 0.5})
    sink.log(2, {"train/loss": 0.25})
    sink.log_image(2, "mismatch/plot", image_path)
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(event.step, event.value) for event in events.Scalars("train/loss")] == [(1, 0.5), (2, 0.25)]
    (image,) = events.Images("mismatch/plot")
    assert (image.step, image.width, image.height) == (2, 8, 6)
