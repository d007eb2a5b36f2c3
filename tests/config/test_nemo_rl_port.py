"""Porting NeMo-RL configs (the mirrors of NeMo-RL's own files in tests/data/nemo_rl/examples): every input key gets
one row with a reason, the mapping of the algorithm, model, optimizer and generation keys is pinned, keys at
NeMo-RL's neutral values are dropped rather than refused, what asyncppo cannot express is refused naming the
feature, and `asyncppo train`'s loader recognises and ports a NeMo-RL file."""

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncppo.config import ConfigError, load_config, validate_tree
from asyncppo.config.nemo_rl import format_table, is_nemo_rl_tree, load_nemo_rl_tree, port_file, port_tree
from asyncppo.config.nemo_rl.algorithm_rules import FILLED_NOTE
from asyncppo.config.nemo_rl.port import PortResult, load_run_config

EXAMPLES = Path(__file__).parents[1] / "data" / "nemo_rl" / "examples"
MATH = EXAMPLES / "configs" / "ppo_math_1B.yaml"
MEGATRON_RECIPE = EXAMPLES / "configs" / "recipes" / "llm" / "ppo-dsr1-7b-math-8n8g-megatron.yaml"
TWO_NODES = (
    EXAMPLES
    / "configs"
    / "recipes"
    / "llm"
    / "ppo-qwen2.5-1.5b-gsm8k-2n8g-megatron-valuetp2sp-dynbatch-noncolocated.yaml"
)
GRPO = EXAMPLES / "configs" / "grpo_math_1B.yaml"
GYM = EXAMPLES / "nemo_gym" / "grpo_nanov3.yaml"


def _rows(result: PortResult) -> dict[str, tuple[str, str]]:
    return {row.key: (row.action, row.detail) for row in result.rows}


def _target(source: str, detail: str) -> str:
    """The asyncppo key a mapped row names (`same key` is the source's own name)."""
    return source if detail == "same key" else detail.split(" ")[0]


def _leaf_keys(node: dict[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, value in node.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value and key not in ("policy.scheduler", "value.scheduler"):
            keys.extend(_leaf_keys(value, f"{key}."))
        else:
            keys.append(key)
    return keys


def _source(path: Path = MATH) -> dict[str, Any]:
    return load_nemo_rl_tree(path)


@pytest.mark.parametrize("path", [MATH, GRPO, GYM], ids=lambda path: path.name)
def test_every_input_key_has_one_row_and_every_dropped_key_a_reason_in_the_table(path: Path) -> None:
    result = port_file(path)
    keys = _leaf_keys(load_nemo_rl_tree(path))
    given = [row.key for row in result.rows if FILLED_NOTE not in row.detail]
    assert given == keys  # input order; the rows of NeMo-RL's defaults for absent keys come on top of them
    table = format_table(result.rows)
    # Wrapping only adds whitespace between words, so each row reads whole once the whitespace is collapsed.
    flat = " ".join(table.split())
    for row in result.rows:
        if row.action in ("neutral", "backend"):
            assert len(row.detail.split()) >= 3, row  # a reason, not just a word
        assert f"{row.key} {row.action} {' '.join(row.detail.split())}" in flat, row
    # 100 columns, but for a line whose dotted key (never split) is itself too long to fit.
    assert all(len(line) <= 100 or max(map(len, line.split())) > 40 for line in table.splitlines())


EXPECTED_POLICY_MAPPING = {
    "policy.model_name": "model.model_name",
    "policy.tokenizer.name": "model.tokenizer",
    "policy.train_global_batch_size": "model.train_global_batch_size",
    "policy.train_micro_batch_size": "model.train_micro_batch_size",
    "policy.logprob_batch_size": "model.logprob_batch_size",
    "policy.max_total_sequence_length": "model.max_total_sequence_length",
    "policy.precision": "model.precision",
    "policy.max_grad_norm": "model.max_grad_norm",
    "policy.optimizer.kwargs.lr": "model.optimizer.lr",
    "policy.optimizer.kwargs.weight_decay": "model.optimizer.weight_decay",
    "policy.optimizer.kwargs.betas": "model.optimizer.betas",
    "policy.optimizer.kwargs.eps": "model.optimizer.eps",
    "policy.dtensor_cfg.activation_checkpointing": "model.activation_checkpointing",
    "policy.generation.max_new_tokens": "generation.max_new_tokens",
    "policy.generation.temperature": "generation.temperature",
    "policy.generation.top_p": "generation.top_p",
    "policy.generation.top_k": "generation.top_k",
    "policy.generation.val_temperature": "generation.val_temperature",
    "policy.generation.vllm_cfg.gpu_memory_utilization": "generation.gpu_memory_utilization",
    "policy.generation.colocated.enabled": "generation.colocated.enabled",
    "value.optimizer.kwargs.lr": "value.optimizer.lr",
    "value.train_global_batch_size": "value.train_global_batch_size",
    "value.train_micro_batch_size": "value.train_micro_batch_size",
}
# Keys of ppo_math_1B.yaml at NeMo-RL's stock values: dropped with a reason (neutral: asyncppo does the same;
# backend: machinery asyncppo replaces), never refused.
EXPECTED_DROPPED = {
    "ppo.val_batch_size": "backend",
    "policy.optimizer.name": "neutral",
    "policy.scheduler": "neutral",  # [ConstantLR factor 1, milestones []]: asyncppo's default constant schedule
    "value.scheduler": "neutral",
    "policy.tokenizer.chat_template_kwargs": "neutral",
    "policy.offload_optimizer_for_logprob": "neutral",
    "policy.logprob_chunk_size": "backend",  # null: no chunking; asyncppo's chunking changes memory, not results
    "policy.generation_batch_size": "backend",
    "policy.generation.backend": "backend",
    "policy.generation.val_top_k": "neutral",
    "policy.generation.mcore_generation_config.buffer_size_gb": "backend",  # unused under generation.backend=vllm
    "policy.dtensor_cfg.tensor_parallel_size": "backend",
    "policy.dtensor_cfg.lora_cfg.enabled": "neutral",
    "policy.generation.vllm_cfg.max_model_len": "backend",
    "policy.sequence_packing.enabled": "backend",
    "checkpointing.save_optimizer": "neutral",
    "value.tokenizer.name": "neutral",
    "data.num_workers": "backend",
    "data.use_multiple_dataloader": "neutral",
    "data.default.prompt_file": "neutral",
    "data.default.processor": "neutral",
    "logger.mlflow.run_name": "neutral",
    "logger.swanlab.project": "neutral",
    "logger.wandb.log_nemo_gym_full_result_tables": "neutral",
}


def test_every_algorithm_key_keeps_its_name() -> None:
    """`ppo.*`, `loss_fn.*`, `value_loss_fn.*` map to the same asyncppo key, but for the renamed or dropped ones."""
    renamed = {"ppo.async_ppo.warmup_generation_lead_steps", "ppo.adv_estimator.name"}
    for key, (action, detail) in _rows(port_file(MATH)).items():
        if key.split(".")[0] not in ("ppo", "loss_fn", "value_loss_fn") or key in renamed:
            continue
        if key in EXPECTED_DROPPED:
            assert action == EXPECTED_DROPPED[key], key
        else:
            assert (action, detail) == ("mapped", "same key"), key


def test_the_policy_and_value_keys_map_as_pinned() -> None:
    rows = _rows(port_file(MATH))
    for source, target in EXPECTED_POLICY_MAPPING.items():
        action, detail = rows[source]
        assert action == "mapped" and _target(source, detail) == target, (source, detail)
    for source, action in EXPECTED_DROPPED.items():
        assert rows[source][0] == action, (source, rows[source])


def test_converted_values() -> None:
    math = port_file(MATH).tree
    assert math["model"]["optimizer"] == {"lr": 1e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    assert "scheduler" not in math["model"] and "scheduler" not in math["value"]  # constant: asyncppo's default
    assert "logprob_chunk_size" not in math["model"]  # null in NeMo-RL: asyncppo keeps its own chunking
    assert math["generation"]["top_k"] == 0 and math["checkpointing"]["metric_name"] == "val:reward_mean"
    # NeMo-RL's GAE has no residual baseline; asyncppo requires the key, so the port writes it.
    assert math["ppo"]["adv_estimator"]["residual_baseline"] is False
    # The relative references ${.temperature} / ${.top_p} resolved to their siblings.
    assert (math["generation"]["val_temperature"], math["generation"]["val_top_p"]) == (1.0, 1.0)
    # max_new_tokens = the context: the context less the prompt budget.
    assert (math["generation"]["max_new_tokens"], math["data"]["max_input_seq_length"]) == (14336, 2048)
    assert math["ppo"]["async_ppo"]["warmup_max_trajectory_age_steps"] is None
    validate_tree(math)


def test_the_megatron_optimizer_and_schedule_become_asyncppos() -> None:
    result = port_file(MEGATRON_RECIPE)
    assert result.refusals == []
    model = result.tree["model"]
    assert model["optimizer"] == {"lr": 1e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    assert model["scheduler"] == pytest.approx(
        {"name": "constant", "warmup_steps": 10, "total_steps": 1000, "min_lr_ratio": 0.1}
    )
    assert result.tree["value"]["optimizer"]["lr"] == 2e-5 and result.tree["value"]["scheduler"]["warmup_steps"] == 0
    rows = _rows(result)
    assert rows["policy.optimizer"][0] == "backend" and rows["policy.scheduler"][0] == "backend"
    assert rows["value.reward_model_cfg.enabled"][0] == "backend"  # read by the DTensor critic only
    assert rows["policy.megatron_cfg.activation_checkpointing"] == ("mapped", "model.activation_checkpointing")
    validate_tree(result.tree)


def test_max_new_tokens_of_the_whole_context_follows_the_shaped_response_length() -> None:
    source = _source()
    source["data"]["max_input_seq_length"] = source["policy"]["max_total_sequence_length"]
    tree = port_tree(source).tree
    assert (tree["generation"]["max_new_tokens"], tree["data"]["max_input_seq_length"]) == (14336, 2048)
    validate_tree(tree)


def test_a_shorter_max_new_tokens_is_kept() -> None:
    source = _source()
    source["policy"]["generation"]["max_new_tokens"] = 1024
    tree = port_tree(source).tree
    assert (tree["generation"]["max_new_tokens"], tree["data"]["max_input_seq_length"]) == (1024, 2048)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("policy.optimizer.name", "torch.optim.SGD", "AdamW only"),
        ("policy.dtensor_cfg.lora_cfg.enabled", True, "asyncppo has no LoRA adapters"),
        ("checkpointing.save_optimizer", False, "optimizer"),
        ("data.default.prompt_file", "cot.txt", "asyncppo has no prompt template over chat-message rows"),
        ("policy.tokenizer.chat_template_kwargs", {"enable_thinking": True}, "asyncppo has no chat-template arguments"),
        ("policy.generation.val_top_k", 20, "asyncppo has no validation top_k of its own"),
        ("policy.generation.vllm_cfg.precision", "fp8", "asyncppo has no quantized (FP8) generation"),
        ("policy.draft.enabled", True, "asyncppo has no speculative-decoding draft model"),
        ("data.use_multiple_dataloader", True, "asyncppo has no multiple dataloaders"),
        ("logger.swanlab_enabled", True, "asyncppo has no SwanLab sink"),
        ("on_policy_distillation", {"teachers": []}, "asyncppo has no on-policy distillation"),
        (
            "policy.scheduler",
            [{"name": "torch.optim.lr_scheduler.StepLR", "kwargs": {}}],
            "expected ConstantLR, LinearLR or CosineAnnealingLR",
        ),
        ("value.tokenizer.name", "other", "policy's tokenizer"),
        (
            "policy.scheduler",
            [{"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": "tenth"}}, {"milestones": []}],
            "scheduler kwargs must be numbers",
        ),
    ],
)
def test_what_asyncppo_cannot_express_is_refused_naming_it(key: str, value: Any, reason: str) -> None:
    source = _source()
    _set(source, key, value)
    refusals = port_tree(source).refusals
    assert len(refusals) == 1 and refusals[0].startswith(f"{key}") and reason in refusals[0], refusals


def test_keys_with_an_asyncppo_equivalent_are_mapped_and_validate() -> None:
    source = _source()
    source["ppo"]["policy_training_start_step"] = 5
    source["ppo"]["async_ppo"]["warmup_generation_lead_steps"] = 3
    source["ppo"]["warm_start_value_checkpoint"] = "results/critic/step_300/value"
    source["policy"]["logprob_chunk_size"] = 2048
    source["reward_penalties"] = {"token_ids": {"unwanted": [151643], "think_open": None}}
    result = port_tree(source)
    rows = _rows(result)
    assert result.refusals == []
    assert rows["ppo.async_ppo.warmup_generation_lead_steps"][1].startswith(
        "ppo.async_ppo.warmup_max_trajectory_age_steps"
    )
    assert result.tree["ppo"]["async_ppo"]["warmup_max_trajectory_age_steps"] == 3
    assert result.tree["value"]["warm_start_path"] == "results/critic/step_300/value"
    assert result.tree["model"]["logprob_chunk_size"] == 2048
    assert result.tree["reward_penalties"] == {"token_ids_unwanted": [151643]}
    assert rows["reward_penalties.token_ids.think_open"][0] == "backend"
    source["reward_penalties"]["token_ids"]["unwanted"] = []
    assert _rows(port_tree(source))["reward_penalties.token_ids.unwanted"][0] == "neutral"
    # token_ids_unwanted only means something on gym runs: the tree is checked without it.
    del result.tree["reward_penalties"]
    validate_tree(result.tree)


def test_the_swe_privileged_critic_is_the_privileged_critic_with_a_system_block() -> None:
    source = _source()
    source["value"]["swe_privileged_critic"] = {
        "enabled": True,
        "max_total_tokens": 4096,
        "caps": {"golden_patch": 2048},
    }
    result = port_tree(source)
    assert result.refusals == []
    critic = result.tree["value"]["privileged_critic"]
    assert (critic["enabled"], critic["placement"], critic["max_total_tokens"]) == (True, "system", 4096)
    assert [(field["title"], field["max_tokens"]) for field in critic["fields"]] == [
        ("fail_to_pass", 24576),
        ("golden_patch", 2048),
        ("test_patch", 4096),
        ("pass_to_pass", 4096),
    ]
    assert critic["fields"][1]["name"] == "responses_create_params.metadata.golden_patch"
    validate_tree(result.tree)
    source["value"]["swe_privileged_critic"] = {"enabled": False, "max_total_tokens": 4096}
    rows = _rows(port_tree(source))
    assert rows["value.swe_privileged_critic.enabled"][0] == rows["value.swe_privileged_critic.max_total_tokens"][0]
    assert rows["value.swe_privileged_critic.enabled"][0] == "neutral"


def test_a_grpo_config_becomes_raw_reward_with_group_baselines() -> None:
    result = port_file(GRPO)
    assert result.refusals == []
    ppo = result.tree["ppo"]
    assert ppo["adv_estimator"] == {
        "name": "raw_reward",
        "normalize_advantages": False,
        "raw_reward_normalize_std": True,
        "raw_reward_baseline": "leave_one_out",
    }
    # One policy pass per step, and GRPO's default of computing the reference logprobs (its KL penalty is 0.01).
    assert (ppo["ppo_epochs"], ppo["skip_reference_policy_logprobs_calculation"]) == (1, False)
    assert result.tree["loss_fn"]["reference_policy_kl_penalty"] == 0.01
    assert "value" not in result.tree
    assert result.tree["model"]["scheduler"] == {"name": "constant", "warmup_steps": 50}
    rows = _rows(result)
    assert rows["grpo.skip_reference_policy_logprobs_calculation"][1].endswith(f"[{FILLED_NOTE} False]")
    assert rows["grpo.normalize_rewards"][0] == "neutral"  # the estimator's own copy is the one mapped
    config = validate_tree(result.tree)
    assert not config.ppo.adv_estimator.uses_critic


def test_a_grpo_config_without_an_estimator_section_gets_nemo_rls_default_estimator() -> None:
    result = port_file(GYM)
    rows = _rows(result)
    assert rows["grpo.adv_estimator.name"][0] == "mapped" and FILLED_NOTE in rows["grpo.adv_estimator.name"][1]
    assert result.tree["ppo"]["adv_estimator"]["raw_reward_baseline"] == "leave_one_out"
    # NeMo-RL's val:total_reward/mean is asyncppo's val:reward_mean.
    assert result.tree["checkpointing"]["metric_name"] == "val:reward_mean"
    validate_tree(result.tree)


@pytest.mark.parametrize(
    ("name", "feature"),
    [("reinforce_plus_plus", "Reinforce++ estimator"), ("gdpo", "GDPO estimator"), ("opd", "distillation")],
)
def test_other_grpo_estimators_are_refused_naming_them(name: str, feature: str) -> None:
    source = _source(GRPO)
    source["grpo"]["adv_estimator"]["name"] = name
    result = port_tree(source)
    assert len(result.refusals) == 1 and feature in result.refusals[0]
    assert _rows(result)["grpo.adv_estimator.normalize_rewards"][0] == "backend"


def _two_node_source(cluster_nodes: int, gpus_per_node: int | None, num_nodes: int | None) -> dict[str, Any]:
    """The two-node non-colocated recipe on `cluster_nodes` 8-GPU nodes, its data read from DAPO's rows."""
    source = load_nemo_rl_tree(TWO_NODES)
    source["data"]["train"] = {"dataset_name": "DAPOMath17K"}
    source["data"]["validation"] = {"dataset_name": "DAPOMathAIME2024"}
    source["data"]["default"]["system_prompt_file"] = None
    source["cluster"]["num_nodes"] = cluster_nodes
    source["policy"]["generation"]["colocated"]["resources"] = {"gpus_per_node": gpus_per_node, "num_nodes": num_nodes}
    return source


RESOURCES = "policy.generation.colocated.resources"


@pytest.mark.parametrize(
    ("cluster_nodes", "gpus_per_node", "num_nodes", "resources", "num_workers"),
    [
        # One node: NeMo-RL carves gpus_per_node generator GPUs out of it (num_nodes null or 1): asyncppo's
        # generators beside the trainers (resources.num_nodes unset), 8 - 4 = 4 trainer GPUs.
        (1, 4, 1, {"gpus_per_node": 4}, 4),
        (1, 4, None, {"gpus_per_node": 4}, 4),
        # Several nodes: generators take num_nodes whole nodes; a null gpus_per_node means the cluster's 8.
        (2, 8, 1, {"gpus_per_node": 8, "num_nodes": 1}, 8),
        (4, None, 2, {"gpus_per_node": 8, "num_nodes": 2}, 16),
    ],
)
def test_generation_resources_port_by_nemo_rl_sizing(
    cluster_nodes: int, gpus_per_node: int | None, num_nodes: int | None, resources: dict[str, int], num_workers: int
) -> None:
    result = port_tree(_two_node_source(cluster_nodes, gpus_per_node, num_nodes))
    assert result.refusals == []
    assert result.tree["generation"]["colocated"] == {"enabled": False, "resources": resources}
    config = validate_tree(result.tree)
    assert (config.generation.num_workers, config.cluster.num_nodes) == (num_workers, cluster_nodes)
    rows = _rows(result)
    assert rows[f"{RESOURCES}.gpus_per_node"][0] == "mapped"
    assert rows[f"{RESOURCES}.num_nodes"][0] == ("mapped" if "num_nodes" in resources else "neutral")


def test_generation_resources_of_a_colocated_run_are_dropped() -> None:
    rows = _rows(port_file(MATH))
    for key in ("gpus_per_node", "num_nodes"):
        assert rows[f"{RESOURCES}.{key}"] == ("neutral", "colocated: generation shares the training workers' devices")


def test_non_colocated_generation_on_one_node_needs_its_gpus_per_node() -> None:
    refusals = port_tree(_two_node_source(1, None, None)).refusals
    assert refusals == [
        f"{RESOURCES}.gpus_per_node: refused: None: non-colocated generation needs its GPUs per node (NeMo-RL "
        "requires it too)"
    ]


def test_generators_on_every_node_port_and_fail_validation_naming_the_key() -> None:
    tree = port_tree(_two_node_source(2, 8, 2)).tree
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert caught.value.lines == [
        "generation.colocated.resources.num_nodes: 2 whole nodes for generators leave none of cluster.num_nodes=2 "
        "for the trainers; raise cluster.num_nodes or lower this"
    ]


def test_a_colocated_run_over_several_gpus_is_told_it_stops_at_start() -> None:
    """asyncppo refuses colocated generation over more than one trainer rank; the row says so, the value is kept."""
    assert _rows(port_file(MATH))["cluster.gpus_per_node"] == ("mapped", "same key")  # one GPU
    source = _source()
    source["cluster"]["gpus_per_node"] = 8
    action, detail = _rows(port_tree(source))["cluster.gpus_per_node"]
    assert action == "mapped" and detail.startswith("cluster.gpus_per_node (colocated: 8 trainer ranks, refused at")
    assert "override cluster.gpus_per_node=1" in detail


def test_a_nemo_rl_tree_is_told_from_an_asyncppo_one() -> None:
    assert is_nemo_rl_tree({"policy": {"model_name": "m"}, "ppo": {}})
    assert not is_nemo_rl_tree({"model": {"model_name": "m"}, "ppo": {}})
    assert not is_nemo_rl_tree({"model": {}, "policy": {}})


def test_the_train_loader_ports_a_nemo_rl_file_and_applies_asyncppo_overrides() -> None:
    table = io.StringIO()
    config = load_run_config(MATH, ["ppo.max_num_steps=3", "cluster.device=cpu"], table=table)
    assert config.ppo.max_num_steps == 3 and config.model.model_name == "Qwen/Qwen2.5-1.5B"
    assert "a NeMo-RL config, ported" in table.getvalue()
    assert "policy.dtensor_cfg.tensor_parallel_size" in table.getvalue()


def test_the_train_loader_reads_an_asyncppo_file_as_before() -> None:
    demo = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"
    table = io.StringIO()
    assert load_run_config(demo, ["ppo.max_num_steps=2"], table=table) == load_config(demo, ["ppo.max_num_steps=2"])
    assert table.getvalue() == ""


def test_the_train_loader_refuses_a_nemo_rl_file_with_refused_keys(tmp_path: Path) -> None:
    source = copy.deepcopy(_source())
    source["policy"]["optimizer"]["name"] = "torch.optim.SGD"
    path = tmp_path / "sgd.yaml"
    path.write_text(yaml.safe_dump(source))
    with pytest.raises(ConfigError) as caught:
        load_run_config(path, table=io.StringIO())
    assert caught.value.lines == [
        "policy.optimizer.name: refused: 'torch.optim.SGD': asyncppo trains with AdamW only (torch.optim.AdamW)"
    ]
