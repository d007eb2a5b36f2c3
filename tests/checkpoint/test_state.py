"""State files (weights_only), RNG round trip, run_state.json and the warm-start marker."""

import collections
import pickle
import random

import numpy as np
import pytest
import torch

from asyncppo.checkpoint import (
    RunState,
    is_warm_start,
    load_run_state,
    load_state,
    mark_warm_start,
    restore_rng_state,
    save_rng_state,
    save_run_state,
    save_state,
    warm_start_source,
)


class Arbitrary:
    """A class a state file must never be allowed to instantiate on load."""

    def __init__(self) -> None:
        self.payload = 1


def draws() -> tuple[list[float], list[float], torch.Tensor]:
    return [random.random() for _ in range(3)], list(np.random.rand(3)), torch.rand(3)


def test_optimizer_and_nested_state_round_trip(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    state = {"optimizer": optimizer.state_dict(), "buffer": [{"version": 3, "ids": torch.arange(4)}], "note": None}
    save_state(tmp_path / "driver.pt", state)
    loaded = load_state(tmp_path / "driver.pt")
    assert loaded["buffer"][0]["version"] == 3
    assert torch.equal(loaded["buffer"][0]["ids"], torch.arange(4))
    restored = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    restored.load_state_dict(loaded["optimizer"])
    assert torch.equal(restored.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_loading_a_pickled_arbitrary_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"thing": Arbitrary()}, path)  # written behind save_state's back
    with pytest.raises(pickle.UnpicklingError):
        load_state(path)


def test_saving_an_arbitrary_object_fails_at_save_time_with_its_key_path(tmp_path):
    with pytest.raises(TypeError, match=r"state\.workers\[1\]: .*Arbitrary"):
        save_state(tmp_path / "bad.pt", {"workers": [1, Arbitrary()]})
    with pytest.raises(TypeError, match="dict key"):
        save_state(tmp_path / "bad.pt", {("tuple", "key"): 1})
    with pytest.raises(TypeError, match="float64"):
        save_state(tmp_path / "bad.pt", {"reward": np.float64(1.0)})  # a float subclass that load would refuse
    with pytest.raises(TypeError, match="defaultdict"):
        save_state(tmp_path / "bad.pt", collections.defaultdict(int))
    assert not (tmp_path / "bad.pt").exists()


def test_rng_round_trip_through_a_state_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's RNG state
    save_state(tmp_path / "rng.pt", save_rng_state())
    expected = draws()
    draws()  # move every RNG further on
    restore_rng_state(load_state(tmp_path / "rng.pt"))
    python_draws, numpy_draws, torch_draws = draws()
    assert python_draws == expected[0]
    assert numpy_draws == expected[1]
    assert torch.equal(torch_draws, expected[2])


def test_run_state_round_trip_with_extra_fields(tmp_path):
    state = RunState(step=12, epoch=1, num_consumed_prompts=96, extra={"policy_version": 12, "dataset": "gsm8k"})
    path = save_run_state(tmp_path, state)
    assert path.name == "run_state.json"
    assert load_run_state(tmp_path) == state


def test_run_state_rejects_clashing_or_non_json_extra(tmp_path):
    with pytest.raises(ValueError, match="clash"):
        save_run_state(tmp_path, RunState(step=1, epoch=0, num_consumed_prompts=0, extra={"step": 2}))
    with pytest.raises(ValueError, match="finite JSON"):
        save_run_state(tmp_path, RunState(step=1, epoch=0, num_consumed_prompts=0, extra={"loss": float("nan")}))
    assert not (tmp_path / "run_state.json").exists()


def test_warm_start_marker(tmp_path):
    assert not is_warm_start(tmp_path)
    assert warm_start_source(tmp_path) is None
    mark_warm_start(tmp_path, "critic_pretrain run 7, step 500")
    assert is_warm_start(tmp_path)
    assert warm_start_source(tmp_path) == "critic_pretrain run 7, step 500"
