"""The graph engine's scheduler: continuous batching of sequences over KV slots, one step at a time.

`GraphCore` (`generation/graph_generator.py`) calls `step()` from its front's serving thread; tests drive it
directly. No threads or locks here. The settings, and the runner sizes they come to, are in `graph_settings.py`.

    add() --> waiting --admit (slot; prefix reuse)--> prefilling --prefill chunks--> decoding --> finished
                                                          ^                            |
                                                          +--- recompute after new weights (optional)

Each step is either a prefill step (packed chunks of waiting contexts under a token budget; rows that reach
the end of their context sample their next token) or a decode step (one token for every decoding row, on
the device, see `graph_runner.py`). A finished row resolves its future at once and frees its slot for the
next waiting request, so a long row never holds up short ones. Prefill runs when nothing decodes, when the
rows waiting for it are a sizeable share of the batch, or when the oldest has waited `max_prefill_wait_steps`
decode steps: this batches arrivals into few prefill steps without starving them.
"""

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from transformers import PreTrainedModel

from asyncppo.generation.decoder_weights import DecoderWeights, decoder_shape, rotary_inverse_frequencies
from asyncppo.generation.graph_runner import GraphRunner
from asyncppo.generation.graph_settings import GraphEngineSettings, runner_settings
from asyncppo.generation.kv_slots import SlotTable
from asyncppo.generation.prefill_packing import PrefillChunk
from asyncppo.generation.protocol import FinishReason, GenerationRequest, GenerationResult, SamplingParams
from asyncppo.generation.serving_front import fail_unless_done
from asyncppo.generation.slot_state import ActiveRow

_MASK64 = (1 << 64) - 1


def request_seed(engine_seed: int, ordinal: int) -> int:
    """A non-negative int64 seed for the `ordinal`-th request since the engine was (re)seeded (splitmix64)."""
    value = (engine_seed * 0x9E3779B97F4A7C15 + ordinal + 1) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (value ^ (value >> 31)) & ((1 << 63) - 1)


@dataclass
class GraphEngineStats:
    """Counters since the engine started."""

    num_requests: int = 0
    num_generated_tokens: int = 0
    prefill_tokens_sent: int = 0
    """Prompt tokens of admitted requests."""
    prefill_tokens_computed: int = 0
    """Tokens the prefill steps ran (less than sent when prefixes were reused; more after recomputes)."""
    prefix_hits: int = 0
    prefill_steps: int = 0
    prefill_seconds: float = 0.0
    decode_steps: int = 0
    decode_rows: int = 0
    """Live rows summed over decode steps (divide by decode_steps for the mean batch)."""
    decode_padded_rows: int = 0
    decode_seconds: float = 0.0
    slot_moves: int = 0
    recomputed_rows: int = 0
    num_slots: int = 0
    kv_cache_bytes: int = 0
    weight_bytes: int = 0
    compile_seconds: float = 0.0
    capture_seconds: float = 0.0
    num_graphs: int = 0


@dataclass
class _Sequence:
    request: GenerationRequest
    future: "Future[GenerationResult]"
    seed: int
    budget: int
    stop_ids: tuple[int, ...]
    context: list[int]
    """Tokens whose KV must exist before the next sample (the prompt; + generated tokens on recompute)."""
    slot: int = -1
    computed: int = 0
    num_generated: int = 0
    first_version: int | None = None
    waited_steps: int = 0


class GraphEngine:
    """Sequences in, GenerationResults out through their futures; `step()` does one prefill or decode step."""

    def __init__(self, model: PreTrainedModel, settings: GraphEngineSettings, policy_version: int = 0):
        shape = decoder_shape(model)
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.settings = settings
        self.vocab_size = shape.vocab_size
        self.weights = DecoderWeights(model, shape, dtype)
        sizes = runner_settings(settings, shape.kv_bytes_per_token(dtype.itemsize), shape.head_dim, device)
        if len(settings.eos_token_ids) >= sizes.max_stop_ids:
            raise ValueError(f"at most {sizes.max_stop_ids - 1} EOS ids, got {settings.eos_token_ids}")
        self.runner = GraphRunner(self.weights, rotary_inverse_frequencies(model), sizes)
        self.slots = SlotTable(sizes.num_slots, settings.min_reused_tokens)
        self.policy_version = policy_version
        self._seed, self._ordinal = settings.seed, 0
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: list[_Sequence] = []
        self._decoding: dict[int, _Sequence] = {}  # by slot
        self.stats = GraphEngineStats(
            num_slots=sizes.num_slots,
            kv_cache_bytes=sum(t.numel() * t.element_size() for t in (*self.runner.k_caches, *self.runner.v_caches)),
            weight_bytes=self.weights.num_bytes(),
        )
        if sizes.use_cuda_graphs:
            self.runner.capture_graphs()
            self.stats.compile_seconds = self.runner.compile_seconds
            self.stats.capture_seconds = self.runner.capture_seconds
            self.stats.num_graphs = len(self.runner._graphs)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._decoding)

    @property
    def max_stop_ids(self) -> int:
        return self.runner.settings.max_stop_ids

    def reseed(self, seed: int) -> None:
        """Derive the seeds of requests added from now on from `seed` (ordinals restart at 0)."""
        self._seed, self._ordinal = seed, 0

    def stop_ids(self, sampling: SamplingParams) -> tuple[int, ...]:
        """The ids that end a request sampled with `sampling`: the EOS ids and its own, none with ignore_eos."""
        if sampling.ignore_eos:
            return ()
        return tuple(dict.fromkeys((*self.settings.eos_token_ids, *sampling.stop_token_ids)))

    def stop_ids_problem(self, sampling: SamplingParams) -> str | None:
        """Why a request sampled with `sampling` has more stop ids than the device's stop table holds, or None."""
        count = len(self.stop_ids(sampling))
        if count > self.max_stop_ids:
            return f"at most {self.max_stop_ids} stop ids (EOS included), got {count}"
        return None

    def add(self, request: GenerationRequest, future: "Future[GenerationResult]") -> None:
        """Queue a validated request (see `weight_loading.request_problem` and `stop_ids_problem`)."""
        sampling = request.sampling
        seed = sampling.seed if sampling.seed is not None else request_seed(self._seed, self._ordinal)
        self._ordinal += 1
        stops = self.stop_ids(sampling)
        if problem := self.stop_ids_problem(sampling):
            fail_unless_done(future, ValueError(problem))
            return
        prompt = list(request.prompt_token_ids)
        budget = min(sampling.max_new_tokens, self.settings.max_context_length - len(prompt))
        self._waiting.append(_Sequence(request, future, seed & ((1 << 63) - 1), budget, stops, prompt))
        self.stats.num_requests += 1

    def step(self) -> None:
        """Admit waiting requests, then run one prefill step or one decode step."""
        self._admit()
        if self._prefilling and (
            not self._decoding
            or len(self._prefilling) * self.settings.prefill_batch_ratio >= len(self._decoding)
            or self._prefilling[0].waited_steps >= self.settings.max_prefill_wait_steps
        ):
            self._prefill_step()
        elif self._decoding:
            self._decode_step()

    def weights_changed(self, version: int, model: PreTrainedModel | None) -> None:
        """New weights (copied from `model` when given) and version, between steps. Cached prefixes are dropped;
        running rows keep their KV or, with recompute_kv_after_weight_update, recompute it."""
        if model is None and version == self.policy_version:
            return
        if model is not None:
            self.weights.refresh(model)
        self.policy_version = version
        self.slots.invalidate()
        if self.settings.recompute_kv_after_weight_update:
            for slot, sequence in list(self._decoding.items()):
                tokens, _ = self.runner.state.read_generated(slot)
                sequence.context = list(sequence.request.prompt_token_ids) + tokens
                self._prefilling.append(sequence)
                self.stats.recomputed_rows += 1
            self.runner.state.deactivate(list(self._decoding))
            self._decoding.clear()
            for sequence in self._prefilling:
                sequence.computed = 0

    def fail_all(self, error: BaseException) -> None:
        """Fail every queued and running request with `error` and free their slots (after a failed step)."""
        sequences = [*self._waiting, *self._prefilling, *self._decoding.values()]
        self.runner.state.deactivate(list(self._decoding))
        for sequence in sequences:
            if sequence.slot >= 0:
                self.slots.release(sequence.slot, (), self.policy_version)
            fail_unless_done(sequence.future, error)
        self._waiting.clear()
        self._prefilling.clear()
        self._decoding.clear()

    # -- steps -------------------------------------------------------------------------------------------
    def _admit(self) -> None:
        capacity = self.runner.settings.decode_buckets[-1]
        while self._waiting and len(self._prefilling) + len(self._decoding) < min(
            capacity, self.settings.max_batch_size
        ):
            sequence = self._waiting[0]
            version = self.policy_version if self.settings.prefix_cache else -1
            acquired = self.slots.acquire(tuple(sequence.context), version)
            if acquired is None:
                return
            self._waiting.popleft()
            if not sequence.future.set_running_or_notify_cancel():  # cancelled while queued
                self.slots.release(acquired.slot, (), self.policy_version)
                continue
            sequence.slot, sequence.computed = acquired.slot, acquired.reused_tokens
            self.stats.prefill_tokens_sent += len(sequence.context)
            self.stats.prefix_hits += int(acquired.reused_tokens > 0)
            self._prefilling.append(sequence)

    def _prefill_step(self) -> None:
        """Prefill the next chunks of the prefilling rows; a row whose context is complete samples its first token
        and goes on to decode, or finishes at once."""
        start = time.perf_counter()
        chunked = self._next_prefill_chunks()
        chunks = [chunk for _, chunk in chunked]
        tokens, logprobs = self.runner.prefill(chunks)
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens_computed += sum(len(chunk.token_ids) for chunk in chunks)
        sampled = iter(zip(tokens, logprobs, strict=True))
        activated: list[ActiveRow] = []
        for sequence, chunk in chunked:
            sequence.computed += len(chunk.token_ids)
            if not chunk.sample:
                continue
            self._prefilling.remove(sequence)
            token, logprob = next(sampled)
            row = self._first_token(sequence, token, logprob)
            if row is not None:
                activated.append(row)
                self._decoding[sequence.slot] = sequence
        self.runner.state.activate(activated)
        self.stats.prefill_seconds += time.perf_counter() - start

    def _next_prefill_chunks(self) -> list[tuple[_Sequence, PrefillChunk]]:
        """The next chunk of each prefilling row, oldest first, while the step's token budget lasts."""
        chunked: list[tuple[_Sequence, PrefillChunk]] = []
        budget = self.settings.max_prefill_tokens
        for sequence in self._prefilling:
            if budget <= 0:
                break
            remaining = len(sequence.context) - sequence.computed
            take = min(remaining, budget)
            sampling = sequence.request.sampling
            chunk = PrefillChunk(
                slot=sequence.slot,
                token_ids=tuple(sequence.context[sequence.computed : sequence.computed + take]),
                start=sequence.computed,
                sample=take == remaining,
                temperature=1.0 if sampling.greedy else sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                greedy=sampling.greedy,
                seed=sequence.seed,
            )
            chunked.append((sequence, chunk))
            budget -= take
        return chunked

    def _first_token(self, sequence: _Sequence, token: int, logprob: float) -> ActiveRow | None:
        """Record the token a prefill sampled for `sequence`: the row's ActiveRow for decode, or None when that
        token already ends it (a stop id, or its budget) and it is finished here."""
        if sequence.first_version is None:
            sequence.first_version = self.policy_version
        sequence.num_generated += 1
        if token in sequence.stop_ids or sequence.num_generated >= sequence.budget:
            earlier = self.runner.state.read_generated(sequence.slot) if sequence.num_generated > 1 else ([], [])
            self._finish(sequence, [*earlier[0], token], [*earlier[1], logprob])
            return None
        sampling = sequence.request.sampling
        return ActiveRow(
            slot=sequence.slot,
            input_token=token,
            input_logprob=logprob,
            context_length=len(sequence.context) + 1,
            num_generated=sequence.num_generated,
            budget=sequence.budget,
            stop_ids=sequence.stop_ids,
            temperature=1.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            greedy=sampling.greedy,
            seed=sequence.seed,
        )

    def _decode_step(self) -> None:
        start = time.perf_counter()
        rows = self.runner.bucket_for(len(self._decoding))
        moves = self.slots.compaction_moves(list(self._decoding), rows)
        while moves is None:  # prefilling rows hold too many low slots: decode a larger bucket instead
            rows = self.runner.bucket_for(rows + 1)
            moves = self.slots.compaction_moves(list(self._decoding), rows)
        if moves:
            self.runner.move(moves)
            for src, dst in moves:
                sequence = self._decoding.pop(src)
                sequence.slot = dst
                self._decoding[dst] = sequence
            self.stats.slot_moves += len(moves)
        # A decoding row's context: its prompt and every token generated so far (the last one is fed now).
        running = self._decoding.values()
        # Rows that finish inside the run idle (inactive) for its remaining steps; the run never outlasts the
        # longest remaining budget, nor the wait limit of the oldest context waiting for prefill.
        steps = min(self.settings.max_decode_steps_per_sync, max(s.budget - s.num_generated for s in running))
        if self._prefilling:
            steps = max(1, min(steps, self.settings.max_prefill_wait_steps - self._prefilling[0].waited_steps))
        longest = max(len(s.request.prompt_token_ids) + s.num_generated for s in running)
        # A row's context never outgrows prompt + budget <= max_positions, whatever the step count.
        window = self.runner.window_for(min(longest + steps - 1, self.runner.settings.max_positions))
        filtered = any(s.request.sampling.top_k > 0 or s.request.sampling.top_p < 1 for s in running)
        finished = self.runner.decode(rows, window, filtered, steps)
        advanced = (len(self._decoding) - len(finished)) * steps
        for slot, (tokens, logprobs) in zip(finished, self.runner.state.read_generated_many(finished), strict=True):
            sequence = self._decoding.pop(slot)
            advanced += len(tokens) - sequence.num_generated
            sequence.num_generated = len(tokens)
            self._finish(sequence, tokens, logprobs)
        for sequence in self._decoding.values():
            sequence.num_generated += steps
        for sequence in self._prefilling:
            sequence.waited_steps += steps
        self.stats.decode_steps += steps
        self.stats.decode_rows += advanced
        self.stats.decode_padded_rows += rows * steps
        self.stats.decode_seconds += time.perf_counter() - start

    def _finish(self, sequence: _Sequence, tokens: list[int], logprobs: list[float]) -> None:
        stopped = bool(tokens) and tokens[-1] in sequence.stop_ids
        reason: FinishReason = "stop" if stopped else "length"
        prompt = list(sequence.request.prompt_token_ids)
        # The last token was sampled but never fed back, so its KV does not exist.
        computed = prompt + tokens[:-1] if self.settings.prefix_cache else []
        self.slots.release(sequence.slot, computed, self.policy_version)
        self.stats.num_generated_tokens += len(tokens)
        assert sequence.first_version is not None
        sequence.future.set_result(
            GenerationResult(
                token_ids=tuple(tokens),
                logprobs=tuple(logprobs),
                finish_reason=reason,
                policy_version=sequence.first_version,
                last_policy_version=self.policy_version,
            )
        )
