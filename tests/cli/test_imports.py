"""Training without the gym must not need the gym's HTTP stack: GPU images may lack fastapi / uvicorn or their
newest dependencies (fastapi 0.165 needs opentelemetry), and importing them would break plain runs."""

import subprocess
import sys


def test_the_trainer_and_workers_import_without_the_http_stack():
    check = (
        "import sys; import asyncppo.cli.train, asyncppo.trainer.loop, asyncppo.trainer.builders; "
        "import asyncppo.workers.groups; "
        "loaded = [m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
