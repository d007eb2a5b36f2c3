"""Training without the gym must not need the gym's HTTP stack: GPU images may lack fastapi / uvicorn or their
newest dependencies (fastapi 0.165 needs opentelemetry), and importing them would break plain runs. Commands that
only read configs answer at once: they never import torch (~7 s of CPU on 2 cores)."""

import subprocess
import sys
from pathlib import Path

DEMO_CONFIG = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


def test_the_trainer_and_workers_import_without_the_http_stack():
    check = (
        "import sys; import asyncppo.cli.train, asyncppo.trainer.loop, asyncppo.trainer.builders; "
        "import asyncppo.trainer.stopping, asyncppo.workers.groups; "
        "loaded = [m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_config_commands_answer_without_importing_torch():
    check = (
        "import sys; from asyncppo.cli.main import main; "
        f"code = [main(['config', 'show', {str(DEMO_CONFIG)!r}]), main(['config', 'keys', 'ppo.async_ppo'])]; "
        "assert code == [0, 0], code; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
