"""ReplayGenerator: the `replay` backend, which answers each prompt with a continuation recorded earlier.

No model runs: tests (and anyone debugging a worker or a rollout) get exact, known tokens and logprobs through the
same ServingFront, builder registry and Generator protocol as the real engines. A recording is a JSON-lines file,
one finished request a line, written by `write_recording` from any engine's requests and results:

    {"prompt_token_ids": [5, 6], "token_ids": [9, 2], "logprobs": [-0.7, -1.2], "finish_reason": "stop"}

    submit() --> ServingFront --> turn: admit <= max_batch_size --> ReplayCore.step: k-th recording of the prompt

The k-th request for a prompt since the last reseed gets that prompt's k-th recording (cycling), so a group of
samples of one prompt gets the distinct continuations recorded for it. A prompt with no recording fails at submit.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from asyncppo.generation.engine_settings import EngineSettings
from asyncppo.generation.protocol import FinishReason, GenerationRequest, GenerationResult
from asyncppo.generation.serving_front import ServingFront, Submission

_FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length")


@dataclass(frozen=True)
class RecordedContinuation:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason


def write_recording(
    path: str | Path, requests: Sequence[GenerationRequest], results: Sequence[GenerationResult]
) -> None:
    """Write the (request, result) pairs as a recording the replay backend answers from, in order."""
    with Path(path).open("w") as file:
        for request, result in zip(requests, results, strict=True):
            line = {
                "prompt_token_ids": list(request.prompt_token_ids),
                "token_ids": list(result.token_ids),
                "logprobs": list(result.logprobs),
                "finish_reason": result.finish_reason,
            }
            file.write(json.dumps(line) + "\n")


def read_recording(path: str | Path) -> dict[tuple[int, ...], list[RecordedContinuation]]:
    """A recording's continuations by prompt, in file order; ValueError naming the line of a malformed one."""
    recorded: dict[tuple[int, ...], list[RecordedContinuation]] = {}
    with Path(path).open() as file:
        for number, text in enumerate(file, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                prompt = tuple(int(token) for token in line["prompt_token_ids"])
                continuation = RecordedContinuation(
                    tuple(int(token) for token in line["token_ids"]),
                    tuple(float(logprob) for logprob in line["logprobs"]),
                    line["finish_reason"],
                )
            except (ValueError, KeyError, TypeError) as error:  # one message for every malformed line
                raise ValueError(f"{path}:{number}: not a recorded request ({error!r})") from None
            if not continuation.token_ids or len(continuation.logprobs) != len(continuation.token_ids):
                raise ValueError(f"{path}:{number}: needs at least one token and one logprob per token")
            if continuation.finish_reason not in _FINISH_REASONS:
                raise ValueError(f"{path}:{number}: finish_reason {continuation.finish_reason!r} is not stop or length")
            recorded.setdefault(prompt, []).append(continuation)
    return recorded


class ReplayCore:
    """The replay EngineCore: a step answers every admitted request from the recording. Weights are not used; a
    weights change only sets the version results carry."""

    def __init__(
        self,
        recorded: dict[tuple[int, ...], list[RecordedContinuation]],
        source: str,
        max_batch_size: int,
        max_context_length: int,
        policy_version: int,
    ) -> None:
        if max_batch_size < 1 or max_context_length < 2:
            raise ValueError(
                f"need max_batch_size >= 1 and max_context_length >= 2, got {max_batch_size}, {max_context_length}"
            )
        self._recorded, self._source = recorded, source
        self._max_batch_size, self._max_context_length = max_batch_size, max_context_length
        self._policy_version = policy_version
        self._served: dict[tuple[int, ...], int] = {}  # requests answered per prompt since the last reseed
        self._batch: list[Submission] = []
        self._num_requests = 0
        self._num_generated_tokens = 0

    def request_problem(self, request: GenerationRequest) -> str | None:
        prompt = request.prompt_token_ids
        if prompt not in self._recorded:
            return f"{self._source} has no recording of this prompt ({len(prompt)} tokens, starting {list(prompt[:5])})"
        if len(prompt) >= self._max_context_length:
            return (
                f"the prompt has {len(prompt)} tokens, which leaves no room to generate under "
                f"max_context_length={self._max_context_length}"
            )
        return None

    def admission_limit(self) -> int | None:
        return self._max_batch_size - len(self._batch)

    def admit(self, submissions: Sequence[Submission]) -> None:
        self._batch.extend(s for s in submissions if s[1].set_running_or_notify_cancel())

    def has_work(self) -> bool:
        return bool(self._batch)

    def step(self) -> None:
        """Answer the admitted batch: each request's recording, cut to its token budget (then finish_reason
        length)."""
        batch, self._batch = self._batch, []
        for request, future in batch:
            prompt = request.prompt_token_ids
            choices = self._recorded[prompt]
            served = self._served.get(prompt, 0)
            self._served[prompt] = served + 1
            recorded = choices[served % len(choices)]
            budget = min(request.sampling.max_new_tokens, self._max_context_length - len(prompt))
            cut = len(recorded.token_ids) > budget
            self._num_requests += 1
            self._num_generated_tokens += min(budget, len(recorded.token_ids))
            future.set_result(
                GenerationResult(
                    token_ids=recorded.token_ids[:budget],
                    logprobs=recorded.logprobs[:budget],
                    finish_reason="length" if cut else recorded.finish_reason,
                    policy_version=self._policy_version,
                    last_policy_version=self._policy_version,
                )
            )

    def fail_all(self, error: BaseException) -> None:
        batch, self._batch = self._batch, []
        for _, future in batch:
            future.set_exception(error)  # started by admit, so no caller can have cancelled it meanwhile

    def weights_changed(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]] | None) -> None:
        self._policy_version = version

    def reseed(self, seed: int) -> None:
        """Start every prompt at its first recording again (the seed's value plays no part: nothing is drawn)."""
        self._served.clear()

    def counters(self) -> dict[str, float]:
        return {"num_requests": float(self._num_requests), "num_generated_tokens": float(self._num_generated_tokens)}


class ReplayGenerator(ServingFront):
    """A Generator that replays the recording at `path` (see the module docstring)."""

    def __init__(self, path: str | Path, max_batch_size: int, max_context_length: int, policy_version: int = 0):
        core = ReplayCore(read_recording(path), str(path), max_batch_size, max_context_length, policy_version)
        super().__init__("ReplayGenerator", core, policy_version)


def build_replay_generator(model: PreTrainedModel, settings: EngineSettings, seed: int) -> ReplayGenerator:
    """The replay backend's builder for `engines.BACKENDS`: the model and seed are not used (nothing is sampled)."""
    if settings.replay_path is None:
        raise ValueError("the replay backend needs EngineSettings.replay_path: the recording to answer from")
    return ReplayGenerator(settings.replay_path, settings.max_batch_size, settings.max_context_length)
