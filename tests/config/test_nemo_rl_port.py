"""Porting NeMo-RL PPO configs: both reconstructed configs of the pull request port and validate, every input key
gets one row (dropped ones with a reason), the mapping of the algorithm and batch/optimizer keys is pinned, and
`asyncppo train`'s loader recognises and ports a NeMo-RL file."""

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncppo.config import ConfigError, load_config, validate_tree
from asyncppo.config.nemo_rl import format_table, is_nemo_rl_tree, load_nemo_rl_tree, port_file, port_tree
from asyncppo.config.nemo_rl.port import PortResult, load_run_config

DATA = Path(__file__).parents[1] / "data" / "nemo_rl"
MATH = DATA / "ppo_math_1B.yaml"
GYM = DATA / "ppo_async_gym.yaml"
CONFIGS = [MATH, GYM]


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


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_the_pull_request_configs_port_and_validate(path: Path) -> None:
    result = port_file(path)
    assert result.refusals == []
    config = validate_tree(result.tree)
    assert config.model.model_name == load_nemo_rl_tree(path)["policy"]["model_name"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_every_input_key_has_one_row_and_every_dropped_key_a_reason_in_the_table(path: Path) -> None:
    result = port_file(path)
    assert [row.key for row in result.rows] == _leaf_keys(load_nemo_rl_tree(path))
    table = format_table(result.rows)
    # Wrapping only adds whitespace between words, so each row reads whole once the whitespace is collapsed.
    flat = " ".join(table.split())
    for row in result.rows:
        if row.action in ("neutral", "backend"):
            assert len(row.detail.split()) >= 3, row  # a reason, not just a word
        assert f"{row.key} {row.action} {' '.join(row.detail.split())}" in flat, row
    # 100 columns, but for a line whose dotted key (never split) is itself too long to fit.
    assert all(len(line) <= 100 or max(map(len, line.split())) > 40 for line in table.splitlines())


# NeMo-RL key -> asyncppo key (or action) for the keys whose mapping a NeMo-RL user relies on.
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
    "policy.scheduler": "model.scheduler",
    "policy.dtensor_cfg.activation_checkpointing": "model.activation_checkpointing",
    "policy.dynamic_batching.train_mb_tokens": "model.max_tokens_per_microbatch",
    "policy.generation.max_new_tokens": "generation.max_new_tokens",
    "policy.generation.temperature": "generation.temperature",
    "policy.generation.top_p": "generation.top_p",
    "policy.generation.top_k": "generation.top_k",
    "policy.generation.vllm_cfg.gpu_memory_utilization": "generation.gpu_memory_utilization",
    "policy.generation.colocated.enabled": "generation.colocated.enabled",
    "value.optimizer.kwargs.lr": "value.optimizer.lr",
    "value.scheduler": "value.scheduler",
    "value.train_global_batch_size": "value.train_global_batch_size",
    "value.train_micro_batch_size": "value.train_micro_batch_size",
}
EXPECTED_DROPPED = {
    "ppo.val_batch_size": "backend",
    "ppo.calculate_advantages_on_gpu": "backend",
    "policy.optimizer.name": "neutral",
    "policy.generation_batch_size": "backend",
    "policy.generation.backend": "backend",
    "policy.dtensor_cfg.tensor_parallel_size": "backend",
    "policy.generation.vllm_cfg.max_model_len": "backend",
    "policy.sequence_packing.enabled": "backend",
    "checkpointing.save_optimizer": "neutral",
    "value.tokenizer.name": "neutral",
}
# The Megatron policy of the async config: its optimizer and schedule come from megatron_cfg.
EXPECTED_MEGATRON_MAPPING = {
    "policy.megatron_cfg.optimizer.lr": "model.optimizer.lr",
    "policy.megatron_cfg.optimizer.weight_decay": "model.optimizer.weight_decay",
    "policy.megatron_cfg.optimizer.adam_beta1": "model.optimizer.betas",
    "policy.megatron_cfg.optimizer.adam_beta2": "model.optimizer.betas",
    "policy.megatron_cfg.optimizer.adam_eps": "model.optimizer.eps",
    "policy.megatron_cfg.optimizer.min_lr": "model.scheduler.min_lr_ratio",
    "policy.megatron_cfg.scheduler.lr_decay_style": "model.scheduler.name",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": "model.scheduler.warmup_steps",
    "policy.megatron_cfg.scheduler.lr_decay_iters": "model.scheduler.total_steps",
    "policy.megatron_cfg.activation_checkpointing": "model.activation_checkpointing",
    "policy.generation.colocated.resources.gpus_per_node": "generation.colocated.resources.gpus_per_node",
    "policy.generation.colocated.resources.num_nodes": "generation.colocated.resources.num_nodes",
}


def test_every_algorithm_key_keeps_its_name() -> None:
    """`ppo.*`, `loss_fn.*`, `value_loss_fn.*` map to the same asyncppo key, but for the two dropped ppo keys."""
    for path in CONFIGS:
        for key, (action, detail) in _rows(port_file(path)).items():
            if key.split(".")[0] not in ("ppo", "loss_fn", "value_loss_fn"):
                continue
            if key in EXPECTED_DROPPED:
                assert action == EXPECTED_DROPPED[key], key
            elif key == "ppo.max_rollout_turns" and path == GYM:
                assert action == "neutral"  # null: gym agents bound their own turns
            else:
                assert (action, detail) == ("mapped", "same key"), key


def test_the_policy_and_value_keys_map_as_pinned() -> None:
    rows = _rows(port_file(MATH))
    for source, target in EXPECTED_POLICY_MAPPING.items():
        action, detail = rows[source]
        assert action == "mapped" and _target(source, detail) == target, (source, detail)
    for source, action in EXPECTED_DROPPED.items():
        assert rows[source][0] == action, source
    megatron_rows = _rows(port_file(GYM))
    for source, target in EXPECTED_MEGATRON_MAPPING.items():
        action, detail = megatron_rows[source]
        assert action == "mapped" and _target(source, detail) == target, (source, detail)
    assert megatron_rows["policy.optimizer"][0] == "backend"
    assert megatron_rows["policy.dtensor_cfg.activation_checkpointing"][0] == "backend"


def test_converted_values() -> None:
    math = port_file(MATH).tree
    assert math["model"]["optimizer"] == {"lr": 1e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    assert math["model"]["scheduler"] == {"name": "constant", "warmup_steps": 50}
    critic_schedule = math["value"]["scheduler"]
    assert critic_schedule["name"] == "cosine" and critic_schedule["total_steps"] == 1020
    assert critic_schedule["min_lr_ratio"] == pytest.approx(0.1)
    assert math["generation"]["top_k"] == 0 and math["checkpointing"]["metric_name"] == "val:reward_mean"
    # max_new_tokens = the context: the context less the prompt budget.
    assert (math["generation"]["max_new_tokens"], math["data"]["max_input_seq_length"]) == (14336, 2048)
    gym = port_file(GYM).tree
    assert gym["model"]["optimizer"]["betas"] == [0.9, 0.98]
    assert gym["model"]["scheduler"] == pytest.approx(
        {"min_lr_ratio": 0.1, "name": "cosine", "warmup_steps": 10, "total_steps": 1000}
    )
    # Two 8-GPU nodes, generators on one of them: 8 generator workers, the other node's 8 GPUs train.
    assert gym["generation"]["colocated"] == {"enabled": False, "resources": {"gpus_per_node": 8, "num_nodes": 1}}
    assert gym["cluster"] == {"gpus_per_node": 8, "num_nodes": 2} and "num_workers" not in gym["generation"]
    assert validate_tree(gym).generation.num_workers == 8
    assert gym["env"]["gym"] == {"launch": "external", "head_server_url": "http://127.0.0.1:11000"}
    # No prompt limit and no shaping: the context is split in halves.
    assert (gym["generation"]["max_new_tokens"], gym["data"]["max_input_seq_length"]) == (16384, 16384)


def _math_source() -> dict[str, Any]:
    return load_nemo_rl_tree(MATH)


def test_max_new_tokens_of_the_whole_context_follows_the_shaped_response_length() -> None:
    source = _math_source()
    source["data"]["max_input_seq_length"] = source["policy"]["max_total_sequence_length"]
    tree = port_tree(source).tree
    assert (tree["generation"]["max_new_tokens"], tree["data"]["max_input_seq_length"]) == (14336, 2048)
    validate_tree(tree)


def test_a_shorter_max_new_tokens_is_kept() -> None:
    source = _math_source()
    source["policy"]["generation"]["max_new_tokens"] = 1024
    tree = port_tree(source).tree
    assert (tree["generation"]["max_new_tokens"], tree["data"]["max_input_seq_length"]) == (1024, 2048)


@pytest.mark.parametrize(
    ("edit", "key", "reason"),
    [
        (lambda s: s["policy"]["optimizer"].update(name="torch.optim.SGD"), "policy.optimizer.name", "AdamW only"),
        (lambda s: s["policy"].update(lora={"enabled": True}), "policy.lora.enabled", "no asyncppo key"),
        (lambda s: s["checkpointing"].update(save_optimizer=False), "checkpointing.save_optimizer", "optimizer"),
        (lambda s: s["data"].update(prompt_file="cot.txt"), "data.prompt_file", "bake it into the data"),
        (
            lambda s: s["policy"].update(scheduler=[{"name": "torch.optim.lr_scheduler.StepLR", "kwargs": {}}]),
            "policy.scheduler",
            "expected ConstantLR, LinearLR or CosineAnnealingLR",
        ),
        (lambda s: s["value"]["tokenizer"].update(name="other"), "value.tokenizer.name", "policy's tokenizer"),
        (
            lambda s: s["policy"]["scheduler"][0]["kwargs"].update(start_factor="tenth"),
            "policy.scheduler",
            "scheduler kwargs must be numbers",
        ),
    ],
)
def test_what_asyncppo_cannot_express_is_refused_naming_the_key(edit: Any, key: str, reason: str) -> None:
    source = _math_source()
    edit(source)
    refusals = port_tree(source).refusals
    assert len(refusals) == 1 and refusals[0].startswith(f"{key}: refused: ") and reason in refusals[0], refusals


def _gym_source(cluster_nodes: int, gpus_per_node: int | None, num_nodes: int | None) -> dict[str, Any]:
    """The async gym config on `cluster_nodes` 8-GPU nodes, its generators given the two resources keys."""
    source = load_nemo_rl_tree(GYM)
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
    result = port_tree(_gym_source(cluster_nodes, gpus_per_node, num_nodes))
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
    refusals = port_tree(_gym_source(1, None, None)).refusals
    assert refusals == [
        f"{RESOURCES}.gpus_per_node: refused: None: non-colocated generation needs its GPUs per node (NeMo-RL "
        "requires it too)"
    ]


def test_generators_on_every_node_port_and_fail_validation_naming_the_key() -> None:
    tree = port_tree(_gym_source(2, 8, 2)).tree
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert caught.value.lines == [
        "generation.colocated.resources.num_nodes: 2 whole nodes for generators leave none of cluster.num_nodes=2 "
        "for the trainers; raise cluster.num_nodes or lower this"
    ]


def test_a_colocated_run_over_several_gpus_is_told_it_stops_at_start() -> None:
    """asyncppo refuses colocated generation over more than one trainer rank; the row says so, the value is kept."""
    action, detail = _rows(port_file(MATH))["cluster.gpus_per_node"]
    assert action == "mapped" and detail.startswith("cluster.gpus_per_node (colocated: 8 trainer ranks, refused at")
    assert "override cluster.gpus_per_node=1" in detail
    source = _math_source()
    source["cluster"]["gpus_per_node"] = 1
    assert _rows(port_tree(source))["cluster.gpus_per_node"] == ("mapped", "same key")
    assert _rows(port_file(GYM))["cluster.gpus_per_node"] == ("mapped", "same key")  # non-colocated


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
    source = copy.deepcopy(_math_source())
    source["policy"]["optimizer"]["name"] = "torch.optim.SGD"
    path = tmp_path / "sgd.yaml"
    path.write_text(yaml.safe_dump(source))
    with pytest.raises(ConfigError) as caught:
        load_run_config(path, table=io.StringIO())
    assert caught.value.lines == [
        "policy.optimizer.name: refused: 'torch.optim.SGD': asyncppo trains with AdamW only (torch.optim.AdamW)"
    ]
