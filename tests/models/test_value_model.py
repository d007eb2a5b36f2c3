"""The value model: right-shifted values, a zero-initialised head from a causal LM (without transformers' report
of it as missing), exact save/load."""

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForSequenceClassification, CodeGenConfig, PreTrainedModel

from asyncppo.models.policy import load_policy
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.models.value import load_value_model, save_value_model, value_head, values


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[2, 7] ids; the second row is right-padded after 4 tokens."""
    input_ids = torch.randint(9, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[1, 4:] = 0
    input_ids[1, 4:] = 0
    return input_ids, attention_mask


def trained_looking_value_model(tiny_dir: Path) -> PreTrainedModel:
    """A value model whose head is random, as after some training (a zero head would hide shift errors)."""
    model = load_value_model(tiny_dir)
    with torch.no_grad():
        value_head(model).weight.normal_(generator=torch.Generator().manual_seed(2))
    return model


def test_values_are_right_shifted_head_outputs_of_the_previous_hidden_state(tiny_dir: Path) -> None:
    model = trained_looking_value_model(tiny_dir)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        actual = values(model, input_ids, attention_mask)
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, S, H]
        head_weight = model.score.weight[0]  # [H]
        expected = torch.zeros(2, 7)
        for t in range(1, 7):
            expected[:, t] = hidden[:, t - 1] @ head_weight  # V(state before token t) reads h[t-1]
    expected = expected * attention_mask
    assert actual.dtype == torch.float32 and actual.shape == (2, 7)
    assert torch.all(actual[:, 0] == 0)
    assert torch.all(actual[1, 4:] == 0)  # padding
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    assert torch.all(actual[:, 1:][attention_mask[:, 1:].bool()] != 0)


def test_a_fresh_value_model_from_a_causal_lm_predicts_exactly_zero(tiny_dir: Path) -> None:
    model = load_value_model(tiny_dir)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        predicted = values(model, input_ids, attention_mask)
    assert torch.equal(predicted, torch.zeros(2, 7))
    assert model.config.num_labels == 1 and model.config.pad_token_id == 0


def test_a_fresh_value_model_takes_the_causal_lm_backbone_weights(tiny_dir: Path) -> None:
    backbone = load_value_model(tiny_dir).model.state_dict()
    for name, tensor in load_policy(tiny_dir).model.state_dict().items():
        assert torch.equal(backbone[name], tensor), name


def test_values_are_differentiable_through_head_and_backbone(tiny_dir: Path) -> None:
    input_ids, attention_mask = batch()
    fresh = load_value_model(tiny_dir)
    values(fresh, input_ids, attention_mask).sum().backward()
    # d value / d h = head weight = 0 for a fresh head, so only the head itself moves on the first step.
    assert fresh.score.weight.grad is not None and fresh.score.weight.grad.abs().sum() > 0
    assert torch.count_nonzero(fresh.model.layers[0].mlp.up_proj.weight.grad) == 0
    trained = trained_looking_value_model(tiny_dir)
    values(trained, input_ids, attention_mask).sum().backward()
    assert torch.count_nonzero(trained.model.layers[0].mlp.up_proj.weight.grad) > 0


def test_value_model_save_and_load_is_bit_identical_and_loads_with_the_auto_class(
    tiny_dir: Path, tmp_path: Path
) -> None:
    model = trained_looking_value_model(tiny_dir)
    directory = save_value_model(model, load_tokenizer(tiny_dir), tmp_path / "critic")
    assert (directory / "model.safetensors").is_file() and (directory / "tokenizer.json").is_file()
    for reloaded in (
        load_value_model(directory),
        AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True),
    ):
        state = reloaded.state_dict()
        assert state.keys() == model.state_dict().keys()
        for name, tensor in model.state_dict().items():
            assert torch.equal(state[name], tensor), name
    input_ids, attention_mask = batch()
    with torch.no_grad():
        assert torch.equal(values(load_value_model(directory), input_ids, attention_mask), values(model, *batch()))


def test_an_architecture_without_a_sequence_classification_class_is_rejected(tmp_path: Path) -> None:
    CodeGenConfig(vocab_size=300, n_embd=32, n_layer=1, n_head=4, rotary_dim=4).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'codegen'.*no sequence-classification class"):
        load_value_model(tmp_path)


class RecordsOf(logging.Handler):
    """Collects the records that reach one logger (transformers' loggers do not propagate to the root)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.logger = logging.getLogger(name)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> list[str]:
        self.logger.addHandler(self)
        return self.messages

    def __exit__(self, *_: object) -> None:
        self.logger.removeHandler(self)

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


def test_the_load_report_of_the_fresh_head_alone_is_not_logged(tiny_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_dir, num_labels=1)
    records = RecordsOf("transformers.modeling_utils")
    with records:
        AutoModelForSequenceClassification.from_pretrained(tiny_dir, config=config)
    # transformers itself reports the head as MISSING ("Consider training ..."), as every run printed.
    assert any("LOAD REPORT" in message and "score.weight" in message for message in records.messages)
    records = RecordsOf("transformers.modeling_utils")
    with records:
        load_value_model(tiny_dir)
    assert not any("LOAD REPORT" in message for message in records.messages)


def test_a_load_report_naming_backbone_weights_is_still_logged(tiny_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_dir, tmp_path, dirs_exist_ok=True)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.0.unknown_extra.weight"] = torch.zeros(2)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    records = RecordsOf("transformers.modeling_utils")
    with records:
        load_value_model(tmp_path)
    assert any("LOAD REPORT" in message and "unknown_extra" in message for message in records.messages)
