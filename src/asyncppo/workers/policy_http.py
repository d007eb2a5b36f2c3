"""The policy HTTP server inside a generation host: gym agents reach that host's engine directly, no driver hop.

Called by GeneratorWorker `serve_http` (also for a colocated PolicyWorker), in the host process that owns the engine:

    gym agent --POST /v1/chat/completions--> PolicyServer (uvicorn thread) --submit--> the engine (same process)
"""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import Generator
from asyncppo.gym.policy_server import create_policy_app
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.request_limits import ServerLimits
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.types import SamplingProfile

HOST = "127.0.0.1"


@dataclass(frozen=True)
class PolicyServerSettings:
    """How a generation host serves its engine over HTTP (plain values from `env.gym` and `generation`)."""

    tokenizer_path: str
    model_name: str
    train_sampling: SamplingProfile
    """(temperature, top_p) of training rollouts."""
    validation_sampling: SamplingProfile
    """(temperature, top_p) of validation rollouts; temperature 0 = greedy."""
    max_model_len: int
    api_key: str | None
    port: int
    """0 = a free port; otherwise host rank i listens on port + i."""
    limits: ServerLimits
    """Body cap and per-request deadline."""


def start_policy_server(
    generator: Generator,
    settings: PolicyServerSettings,
    rank: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
    port: int | None = None,
) -> PolicyServer:
    """Serve `generator` on 127.0.0.1 (the tokenizer at settings.tokenizer_path unless given), on `port` when given,
    else as settings.port says; returns once /health answers. OSError when the port cannot be bound."""
    app = create_policy_app(
        generator,
        tokenizer if tokenizer is not None else load_tokenizer(settings.tokenizer_path),
        model_name=settings.model_name,
        train_sampling=settings.train_sampling,
        validation_sampling=settings.validation_sampling,
        max_model_len=settings.max_model_len,
        api_key=settings.api_key,
    )
    if port is None:
        port = settings.port + rank if settings.port else 0
    server = PolicyServer(app, host=HOST, port=port, limits=settings.limits)
    server.start()
    return server
