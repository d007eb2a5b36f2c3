"""PromptStream: per-epoch shuffling, epoch cycling, exact resume (also at epoch ends), weights_only state."""

import io
import itertools

import pytest
import torch

from asyncppo.data.prompt_stream import PromptStream, epoch_order

# 10 rows in batches of 3: 3 batches per epoch, one row dropped per epoch; 4 epochs = 12 batches.
ROWS = [{"prompt": f"q{index}", "answer": str(index)} for index in range(10)]
BATCHES_PER_EPOCH = 3
MAX_EPOCHS = 4


def ids(batch: list[dict]) -> list[str]:
    return [row["prompt"] for row in batch]


def weights_only_round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def make_stream(shuffle: bool = True, max_epochs: int | None = MAX_EPOCHS, seed: int = 7) -> PromptStream:
    return PromptStream(ROWS, batch_size=3, seed=seed, shuffle=shuffle, max_epochs=max_epochs)


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_after_any_batch_yields_exactly_the_uninterrupted_remainder(shuffle):
    reference = [ids(batch) for batch in make_stream(shuffle)]
    assert len(reference) == BATCHES_PER_EPOCH * MAX_EPOCHS
    # Every k, including the epoch ends k = 3, 6, 9 and the very end k = 12.
    for num_consumed in range(len(reference) + 1):
        interrupted = make_stream(shuffle)
        for _ in range(num_consumed):
            next(interrupted)
        state = weights_only_round_trip(interrupted.state_dict())
        resumed = make_stream(shuffle)
        resumed.load_state_dict(state)
        assert resumed.num_prompts_consumed == 3 * num_consumed
        assert [ids(batch) for batch in resumed] == reference[num_consumed:], f"resumed after {num_consumed}"


def test_resume_is_exact_when_cycling_forever_across_many_epochs():
    reference = [ids(batch) for batch in itertools.islice(make_stream(max_epochs=None), 20)]
    for num_consumed in (0, 2, 3, 6, 7, 12, 15):
        interrupted = make_stream(max_epochs=None)
        for _ in range(num_consumed):
            next(interrupted)
        resumed = make_stream(max_epochs=None)
        resumed.load_state_dict(weights_only_round_trip(interrupted.state_dict()))
        assert [ids(batch) for batch in itertools.islice(resumed, 20 - num_consumed)] == reference[num_consumed:]


def test_a_resumed_stream_can_be_saved_and_resumed_again():
    reference = [ids(batch) for batch in make_stream()]
    stream = make_stream()
    taken = [ids(next(stream)) for _ in range(2)]
    for resume_after in (1, 3, 2, 4):  # crosses the epoch ends after batches 3, 6 and 9
        restored = make_stream()
        restored.load_state_dict(weights_only_round_trip(stream.state_dict()))
        stream = restored
        taken += [ids(next(stream)) for _ in range(resume_after)]
    assert taken == reference[: len(taken)]
    assert [ids(batch) for batch in stream] == reference[len(taken) :]


def test_each_epoch_draws_distinct_rows_in_a_new_order_and_drops_the_remainder():
    batches = [ids(batch) for batch in make_stream()]
    epochs = [
        [prompt for batch in batches[start : start + BATCHES_PER_EPOCH] for prompt in batch]
        for start in range(0, len(batches), BATCHES_PER_EPOCH)
    ]
    for epoch in epochs:
        assert len(epoch) == len(set(epoch)) == 9  # 10 rows, drop_last drops one
    assert len({tuple(epoch) for epoch in epochs}) == MAX_EPOCHS
    assert epochs[0] == [f"q{index}" for index in epoch_order(10, seed=7, epoch=0, shuffle=True)[:9]]


def test_without_shuffle_every_epoch_is_in_file_order():
    batches = [ids(batch) for batch in make_stream(shuffle=False)]
    assert batches[:3] == [["q0", "q1", "q2"], ["q3", "q4", "q5"], ["q6", "q7", "q8"]]
    assert batches == batches[:3] * MAX_EPOCHS


def test_the_seed_decides_the_order():
    first, again, other = ([ids(batch) for batch in make_stream(seed=seed)] for seed in (7, 7, 8))
    assert first == again
    assert first != other
    # Hashing (seed, epoch) keeps seed 1's first epoch different from seed 0's second.
    assert epoch_order(100, seed=1, epoch=0, shuffle=True) != epoch_order(100, seed=0, epoch=1, shuffle=True)


def test_epoch_and_prompt_counters_follow_the_batches():
    stream = make_stream()
    for _ in range(3):
        next(stream)
    # The last batch of epoch 0 was drawn; the stream moves to epoch 1 only when the next batch is drawn.
    assert (stream.epoch, stream.num_prompts_consumed) == (0, 9)
    next(stream)
    assert (stream.epoch, stream.num_prompts_consumed) == (1, 12)


def test_the_stream_stops_after_max_epochs_and_stays_stopped():
    stream = make_stream(max_epochs=2)
    assert len(list(stream)) == 2 * BATCHES_PER_EPOCH
    assert stream.finished and stream.epoch == 2
    with pytest.raises(StopIteration):
        next(stream)
    resumed = make_stream(max_epochs=2)
    resumed.load_state_dict(weights_only_round_trip(stream.state_dict()))
    assert resumed.finished and list(resumed) == []


def test_editing_a_yielded_row_does_not_change_later_epochs():
    stream = make_stream(shuffle=False)
    for batch in itertools.islice(stream, 3):
        for row in batch:
            row["prompt"] = "edited"
    assert ids(next(stream)) == ["q0", "q1", "q2"]
    assert ROWS[0]["prompt"] == "q0"


def test_batch_size_equal_to_the_dataset_yields_one_batch_per_epoch():
    stream = PromptStream(ROWS, batch_size=10, seed=0, max_epochs=3)
    assert [sorted(ids(batch)) for batch in stream] == [sorted(ids(ROWS))] * 3


@pytest.mark.parametrize(
    ("rows", "batch_size", "max_epochs", "message"),
    [
        ([], 1, None, "empty dataset"),
        (ROWS, 11, None, "batch_size 11 .* exceeds the 10 rows"),
        (ROWS, 0, None, "batch_size must be >= 1"),
        (ROWS, 2, 0, "max_epochs must be >= 1"),
    ],
)
def test_a_stream_that_could_never_yield_is_rejected_at_construction(rows, batch_size, max_epochs, message):
    with pytest.raises(ValueError, match=message):
        PromptStream(rows, batch_size=batch_size, seed=0, max_epochs=max_epochs)


def test_loading_a_state_saved_with_other_batching_is_rejected():
    state = make_stream().state_dict()
    other = PromptStream(ROWS, batch_size=2, seed=7, max_epochs=MAX_EPOCHS)
    with pytest.raises(ValueError, match="'batch_size': 3"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="'num_rows': 10"):
        PromptStream(ROWS[:9], batch_size=3, seed=7).load_state_dict(state)
