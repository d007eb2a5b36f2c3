"""Hub model ids (`org/name`) resolve once, in the run setup, to their snapshot directory in the Hugging Face cache:
at the pinned revision, offline, and as one config error naming the key, id, revision and cache when not cached."""

from pathlib import Path

import pytest
import torch
from huggingface_hub import scan_cache_dir, snapshot_download

import hub_cache
from asyncppo.config import ConfigError, load_config
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import TINY, build_tiny_model
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.trainer.setup import ModelPaths, resolve_model_path
from hub_cache import FIRST_COMMIT_SPEC, MODEL_ID, HubCaches

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"
offline_hub = hub_cache.offline_hub  # the shared fixtures, registered in this module
hub_caches = hub_cache.hub_caches


@pytest.fixture(autouse=True)
def session_model_cache(shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tiny:tiny` (beside a Hub id in some configs below) is built into the session's cache, not the home's."""
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))


def test_the_model_cache_has_the_layout_huggingface_hub_reads(offline_hub: HubCaches):
    info = scan_cache_dir(offline_hub.hub)
    assert info.warnings == []  # a wrong layout (refs, snapshots, blob links) is reported here
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == (MODEL_ID, "model")
    assert {revision.commit_hash: set(revision.refs) for revision in repo.revisions} == {
        offline_hub.main_commit: {"main"},
        offline_hub.first_commit: {"v1"},
    }
    # Only the weights differ between the two commits: the other 5 files of each link to the same blobs.
    assert len({file.blob_path for revision in repo.revisions for file in revision.files}) == 5 + 2


def test_a_hub_id_resolves_to_the_snapshot_of_main(offline_hub: HubCaches):
    path = resolve_model_path(MODEL_ID)
    assert path == offline_hub.hub / "models--org--tiny" / "snapshots" / offline_hub.main_commit
    assert Path(snapshot_download(MODEL_ID, local_files_only=True)) == path
    policy = load_policy(path)
    expected = build_tiny_model(TINY)
    assert torch.equal(policy.get_input_embeddings().weight, expected.get_input_embeddings().weight)
    assert load_tokenizer(path).eos_token_id is not None


@pytest.mark.parametrize("pin", ["commit", "tag"])
def test_a_pinned_revision_loads_that_revisions_weights(offline_hub: HubCaches, pin: str):
    revision = offline_hub.first_commit if pin == "commit" else "v1"
    config = load_config(DEMO, [f"model.model_name={MODEL_ID}", f"model.revision={revision}"])
    paths = ModelPaths.resolve(config)
    assert paths.policy.name == offline_hub.first_commit
    assert paths.tokenizer == paths.value == paths.policy  # tokenizer and critic follow the policy's revision
    weights = load_policy(paths.policy).get_input_embeddings().weight
    first, main = build_tiny_model(FIRST_COMMIT_SPEC), build_tiny_model(TINY)
    assert torch.equal(weights, first.get_input_embeddings().weight)
    assert not torch.equal(weights, main.get_input_embeddings().weight)


def test_the_critic_has_its_own_revision(offline_hub: HubCaches):
    overrides = [f"model.model_name={MODEL_ID}", f"value.model_name={MODEL_ID}", "value.revision=v1"]
    paths = ModelPaths.resolve(load_config(DEMO, overrides))
    assert (paths.policy.name, paths.value and paths.value.name) == (offline_hub.main_commit, offline_hub.first_commit)


@pytest.mark.parametrize(
    ("overrides", "key", "shown"),
    [
        pytest.param(
            ["model.model_name=org/missing"], "model.model_name", "'org/missing' at revision 'main'", id="model"
        ),
        pytest.param(
            [f"model.model_name={MODEL_ID}", "model.revision=v2"],
            "model.model_name",
            "'org/tiny' at revision 'v2'",
            id="unknown_revision",
        ),
        pytest.param(
            ["model.model_name=tiny:tiny", "model.tokenizer=org/missing"],
            "model.tokenizer",
            "'org/missing' at revision 'main'",
            id="tokenizer",
        ),
        pytest.param(
            ["model.model_name=tiny:tiny", "value.model_name=org/missing", "value.revision=abc"],
            "value.model_name",
            "'org/missing' at revision 'abc'",
            id="critic",
        ),
    ],
)
def test_a_model_not_in_the_cache_offline_is_one_line_naming_key_id_revision_and_cache(
    offline_hub: HubCaches, overrides: list[str], key: str, shown: str
):
    with pytest.raises(ConfigError) as raised:
        ModelPaths.resolve(load_config(DEMO, overrides))
    assert raised.value.lines == [
        f"{key}: Hub model {shown} is not in the Hugging Face cache {offline_hub.hub} and HF_HUB_OFFLINE=1 forbids "
        "downloading it; download it once without HF_HUB_OFFLINE (e.g. `hf download <id>`), or point HF_HOME / "
        "HF_HUB_CACHE at a cache that holds it"
    ]


def test_an_existing_local_directory_wins_over_a_hub_id_of_the_same_name(
    offline_hub: HubCaches, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    local = tmp_path / "org" / "tiny"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path(MODEL_ID) == Path(MODEL_ID)
