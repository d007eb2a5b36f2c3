"""Lossless resume: exactly-once accounting of every prompt draw when the process is killed at random moments.

A killed run keeps only what its last checkpoint saved; everything after it (batches trained, rollouts
finished, rows drawn) is discarded, and fresh objects restored from the checkpoint continue. At the end, on
the surviving timeline, every draw id is trained once or dropped with a reason, and each id names the same
row of the prompt stream that an uninterrupted stream would have produced at that position.
"""

import io
import random
import time
from typing import Any

import pytest
import torch
from pipeline_fakes import FakeGenerator, build, draw_ids_of, random_delay

from asyncppo.data.prompt_stream import PromptStream
from asyncppo.pipeline.staleness import AgeSchedule

NUM_ROWS, BATCH_SIZE, NUM_PROMPTS, NUM_STEPS, MAX_KILLS = 10, 3, 2, 40, 10


class Killed(Exception):
    """The simulated crash."""


def checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """What a real checkpoint keeps: torch.save, then torch.load(weights_only=True)."""
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)


def stream_order(seed: int, num_draws: int) -> list[int]:
    """Row index of the d-th row an uninterrupted stream yields (drop_last loses one row per epoch)."""
    rows = [row["index"] for batch in _take(PromptStream(_rows(), BATCH_SIZE, seed), num_draws) for row in batch]
    return rows[:num_draws]


def _rows() -> list[dict[str, Any]]:
    return [{"index": index, "prompt": f"question {index}"} for index in range(NUM_ROWS)]


def _take(stream: PromptStream, num_rows: int) -> list[list[dict[str, Any]]]:
    batches: list[list[dict[str, Any]]] = []
    while sum(len(batch) for batch in batches) < num_rows:
        batches.append(next(stream))
    return batches


@pytest.mark.parametrize(
    ("in_flight", "drop_incomplete", "train_age", "seed"),
    [(False, True, 1, 0), (True, False, 1, 1), (True, True, 2, 2), (False, False, 2, 3)],
)
def test_exactly_once_accounting_under_random_kill_points(
    in_flight: bool, drop_incomplete: bool, train_age: int, seed: int
):
    rng = random.Random(seed)
    ages = AgeSchedule(policy_training_start_step=6, train_age=train_age, warmup_age=3)
    snapshot: tuple[int, dict[str, Any]] | None = None  # (step to resume at, source state)
    trained_at: dict[int, list[int]] = {}  # surviving timeline: step -> draw ids trained
    row_of_draw: dict[int, int] = {}  # draw id -> row index, across every timeline (must never change)
    kills = 0
    while True:
        start, state = snapshot if snapshot is not None else (0, None)
        trained_at = {step: ids for step, ids in trained_at.items() if step < start}
        generator = FakeGenerator(delay=random_delay(seed + 100 * kills, 0.004))
        setup = build(
            PromptStream(_rows(), BATCH_SIZE, seed),
            generator,
            num_prompts=NUM_PROMPTS,
            start_step=start,
            ages=ages,
            in_flight=in_flight,
            drop_incomplete=drop_incomplete,
        )
        if state is not None:
            setup.source.load_state_dict(checkpoint(state))
        kill_step = start + rng.randrange(6) if kills < MAX_KILLS else NUM_STEPS  # NUM_STEPS: no kill
        kill_phase = rng.choice(["before_batch", "after_batch", "after_update", "after_checkpoint"])
        try:
            for step in range(start, NUM_STEPS):
                if step == kill_step and kill_phase == "before_batch":
                    time.sleep(rng.uniform(0, 0.01))  # rollouts finish, or not, before the crash
                    raise Killed
                batch = setup.source.next_batch(step)
                for trajectory in batch.trajectories:
                    assert ages.policy_age(step, trajectory.policy_version) <= ages.train_age
                    assert (
                        row_of_draw.setdefault(trajectory.group_id, trajectory.task["index"])
                        == (trajectory.task["index"])
                    )
                trained_at[step] = draw_ids_of(batch)
                if step == kill_step and kill_phase == "after_batch":
                    raise Killed
                with setup.source.weight_update(step + 1):
                    setup.generator.version = step + 1
                if step == kill_step and kill_phase == "after_update":
                    raise Killed
                if rng.random() < 0.5:
                    snapshot = (step + 1, setup.source.state_dict())
                if step == kill_step:  # after_checkpoint
                    raise Killed
            report = setup.source.accounting()
            break
        except Killed:
            kills += 1
        finally:
            setup.source.close()

    assert kills == MAX_KILLS
    trained = [draw_id for ids in trained_at.values() for draw_id in ids]
    assert len(trained) == len(set(trained)) == NUM_STEPS * NUM_PROMPTS  # nothing trained twice
    assert report.problems == []  # every draw id trained, dropped with a reason, buffered or pending
    assert sorted(trained) == [draw_id for first, end in report.trained for draw_id in range(first, end)]
    # Draw ids name the stream's rows in order: a resume neither skipped nor repeated a row of the stream.
    expected = stream_order(seed, report.next_draw_id)
    assert all(row_of_draw[draw_id] == expected[draw_id] for draw_id in trained)
