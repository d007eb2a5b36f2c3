"""The tiny model, its tokenizer and their cache: determinism, exact save/load, special token ids."""

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import asyncppo.models.tiny as tiny
from asyncppo.models.chat_template import SPECIAL_TOKENS
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import (
    MEDIUM,
    TINY,
    build_fingerprint,
    build_tiny_model,
    build_tiny_tokenizer,
    ensure_tiny,
    save_tiny,
)
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.models.value import load_value_model

SAMPLE_TEXTS = [
    "What is 12+7? The answer is 19.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>hm</think>ok<|im_end|>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|pad|>',
    "Unicode: déjà vu, 東京, Ωμέγα, emoji 😀🚀, tabs\tand  double  spaces\r\n",
    " leading space and trailing space ",
    "",
]


def test_tiny_presets_have_the_documented_parameter_counts() -> None:
    # TINY, tied embeddings: embed 300*64 = 19,200; per layer q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12,288,
    # mlp 3*64*128 = 24,576, two norms 128 -> 36,992; 2 layers 73,984; final norm 64. Total 93,248.
    assert sum(p.numel() for p in build_tiny_model(TINY).parameters()) == 93_248
    # MEDIUM: embed 1000*256 = 256,000; per layer 4*256*256 + 3*256*1024 + 512 = 1,049,088; 4 layers
    # 4,196,352; final norm 256. Total 4,452,608.
    assert sum(p.numel() for p in build_tiny_model(MEDIUM).parameters()) == 4_452_608


def test_build_tiny_model_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next_draw = torch.rand(3)
    torch.manual_seed(123)
    first, second = build_tiny_model(TINY), build_tiny_model(TINY)
    assert torch.equal(torch.rand(3), expected_next_draw)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    other_seed = build_tiny_model(tiny.TinyModelSpec(**{**TINY.__dict__, "seed": 1}))
    assert not torch.equal(other_seed.model.embed_tokens.weight, first.model.embed_tokens.weight)


def test_build_tiny_tokenizer_is_deterministic_with_exact_vocab_size() -> None:
    first, second = build_tiny_tokenizer(300), build_tiny_tokenizer(300)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert len(first) == 300
    assert len(build_tiny_tokenizer(1000)) == 1000


def test_tiny_tokenizer_keeps_special_tokens_whole_and_adds_no_bos() -> None:
    tokenizer = build_tiny_tokenizer(300)
    assert tokenizer.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == list(SPECIAL_TOKENS)
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<|pad|>", "<|im_end|>", None)
    ids = tokenizer.encode("<|im_start|>user\n<think>x</think><|im_end|>")
    assert ids[0] == SPECIAL_TOKENS.index("<|im_start|>")  # no BOS in front
    assert ids[-1] == tokenizer.eos_token_id
    assert SPECIAL_TOKENS.index("<think>") in ids and SPECIAL_TOKENS.index("</think>") in ids


def test_tiny_tokenizer_round_trips_any_unicode_text_exactly() -> None:
    tokenizer = build_tiny_tokenizer(300)
    for text in SAMPLE_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tiny_vocab_size_below_bytes_plus_special_tokens_is_rejected() -> None:
    with pytest.raises(ValueError, match="vocab_size 200"):
        build_tiny_tokenizer(200)


def test_tiny_model_and_tokenizer_survive_save_and_load_bit_identically(tmp_path: Path) -> None:
    directory = save_tiny(tmp_path / "tiny", TINY)
    model, tokenizer = build_tiny_model(TINY), build_tiny_tokenizer(TINY.vocab_size)
    loaded = load_policy(directory)
    assert type(loaded) is type(model)
    loaded_state = loaded.state_dict()
    assert loaded_state.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded_state[name], tensor), name
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # tying survives the round trip
    # Saving records where the model came from and which class wrote it; every other field is equal.
    ignored = {"_name_or_path", "architectures", "transformers_version"}
    saved_config = {k: v for k, v in loaded.config.to_dict().items() if k not in ignored}
    assert saved_config == {k: v for k, v in model.config.to_dict().items() if k not in ignored}

    reloaded_tokenizer = load_tokenizer(directory)
    for text in SAMPLE_TEXTS:
        assert reloaded_tokenizer.encode(text) == tokenizer.encode(text), text
    assert reloaded_tokenizer.chat_template == tokenizer.chat_template
    assert reloaded_tokenizer.bos_token_id is None
    config = loaded.config
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        reloaded_tokenizer.bos_token_id,
        reloaded_tokenizer.eos_token_id,
        reloaded_tokenizer.pad_token_id,
    )


def test_load_tokenizer_keeps_the_saved_splitting_under_a_qwen2_config(tmp_path: Path) -> None:
    # transformers' AutoTokenizer maps a qwen2 config to Qwen2Tokenizer, which swaps in its own split rules.
    from transformers import Qwen2Config

    tokenizer = build_tiny_tokenizer(300)
    tokenizer.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    for text in SAMPLE_TEXTS:
        assert reloaded.encode(text) == tokenizer.encode(text), text


def test_ensure_tiny_builds_once_and_reuses_the_cached_directory(tmp_path: Path) -> None:
    first = ensure_tiny(tmp_path, "tiny")
    weights = first / "model.safetensors"
    written = os.stat(weights)
    second = ensure_tiny(tmp_path, "tiny")
    assert second == first == tmp_path / f"tiny-{build_fingerprint(TINY)}"
    assert os.stat(weights).st_mtime_ns == written.st_mtime_ns and os.stat(weights).st_ino == written.st_ino
    # No staging directory left behind (the lock file that serialises builds of the same model stays).
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, f".{first.name}.lock"])
    assert isinstance(AutoModelForCausalLM.from_pretrained(first, local_files_only=True), torch.nn.Module)


def test_ensure_tiny_leaves_no_model_behind_when_the_build_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash_after_partial_write(directory: Path, spec: tiny.TinyModelSpec) -> Path:
        (Path(directory) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "save_tiny", crash_after_partial_write)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_tiny(tmp_path, "tiny")
    assert [p for p in tmp_path.iterdir() if p.suffix != ".lock"] == []  # no staging directory, no model
    monkeypatch.undo()
    assert (ensure_tiny(tmp_path, "tiny") / "model.safetensors").is_file()


def test_ensure_tiny_rejects_an_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'huge'"):
        ensure_tiny(tmp_path, "huge")


@pytest.mark.parametrize("loader", [load_policy, load_value_model, load_tokenizer])
def test_loading_a_missing_directory_raises_value_error_naming_the_path(loader, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model") as error:
        loader(missing)
    assert "config.json" in str(error.value)


def test_build_fingerprint_changes_with_the_spec_so_stale_caches_are_not_reused() -> None:
    changed = dataclasses.replace(TINY, seed=TINY.seed + 1)
    assert build_fingerprint(TINY) == build_fingerprint(dataclasses.replace(TINY))
    assert build_fingerprint(changed) != build_fingerprint(TINY)
