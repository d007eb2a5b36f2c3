"""The critic-EV hint the console prints once: one line within 100 columns that points at docs/critic.md."""

from pathlib import Path

import pytest

from asyncppo.config import load_config
from asyncppo.trainer.run_metrics import explained_variance_hint

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


@pytest.mark.parametrize("residual_baseline", [True, False])
def test_the_explained_variance_hint_fits_100_columns_and_names_the_doc(residual_baseline: bool) -> None:
    config = load_config(DEMO, [f"ppo.adv_estimator.residual_baseline={str(residual_baseline).lower()}"])
    hint = explained_variance_hint(config)
    assert len(hint) <= 100 and "\n" not in hint and hint.endswith("see docs/critic.md"), hint
    assert ("-1/(G-1) = -0.14" in hint) == residual_baseline  # the floor of a critic that learned nothing, G = 8
