"""Third-party console output of a training run, off unless `logger.verbose` is true.

`train_until_done_or_stopped` calls `quiet_third_party_output` before it builds the run, so the demo policy's
build, Ray's start and every worker process started after it are covered. What goes, and how:

- Hugging Face progress bars ("Loading weights", "Writing model shards"): switched off in this process, and
  `HF_HUB_DISABLE_PROGRESS_BARS=1` goes into the environment, which the workers of the local Ray cluster
  inherit (transformers reads it when a worker imports it). A value the user set is kept.
- Ray's notice that token authentication is on (it stays on): that logger shows errors only.

Everything else still reaches the console: our own prints, log lines and warnings, transformers' warnings, and
every worker's output (Ray forwards it with a `(WorkerHost pid=...)` prefix), so a worker that crashes still
shows its traceback here, and its error is re-raised by the call that waited for it.
"""

import logging
import os

import huggingface_hub.utils
import transformers.utils.logging

PROGRESS_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"
RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication"
"""Ray logs "Token authentication is enabled for this Ray cluster..." at warning level on every local start."""


def quiet_third_party_output(verbose: bool) -> None:
    """Silence the progress bars and notices listed in the module docstring; `verbose` leaves all as they are."""
    if verbose:
        return
    if PROGRESS_BARS_ENV not in os.environ:
        os.environ[PROGRESS_BARS_ENV] = "1"
        huggingface_hub.utils.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    logging.getLogger(RAY_TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)
