"""The graph engine's device side: the KV cache, per-slot decode state, and the prefill and decode programs.

`GraphEngine` (`generation/graph_engine.py`) drives it between steps; nothing here decides what to run.

    host (scheduler)                          device (this module)
    activate(rows) ------------------------->  slot state: input token, positions, budget, sampling, stops
    prefill(chunks) --> packed forward ----->  KV written, first tokens sampled, returned to the host
    decode(B, W) --> graph replay ---------->  one token for slots 0..B-1: KV written, token sampled, stop and
                                               budget checked, state advanced, all on the device
    <------------- finished flags [B] -------  the only read-back per decode step
    read_generated(slot) <------------------   a finished row's tokens and logprobs

A decode step never syncs with the host until its finished flags are read: the next input token, the
positions and the stop check stay on the device. On CUDA every (batch bucket B, key window W) is one CUDA
graph captured at start over static buffers; the two halves of each layer are compiled once (dynamic sizes)
and shared by all layers and buckets. On CPU the same code runs eagerly (no compile, no graphs).
Letters: as in `generation/decoder_forward.py`; K stop ids per row, G generated-token capacity per row.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from asyncppo.generation.decode_attention import split_count, triton_decode_attention
from asyncppo.generation.decoder_forward import (
    PrefillBatch,
    decode_rest,
    layer_output,
    layer_qkv,
    output_logits,
    padded_prefill_attention,
    prefill_forward,
    prefill_mask,
    qkv_arguments,
    rest_arguments,
    rotary_tables,
)
from asyncppo.generation.decoder_weights import DecoderWeights
from asyncppo.generation.graph_sampling import sample_tokens
from asyncppo.generation.prefill_attention import (
    block_tokens,
    max_query_blocks,
    query_blocks,
    triton_prefill_attention,
)
from asyncppo.generation.race_sampling import race_sample_tokens

# Columns of the int64 slot-state matrix [S + 1, 9].
INPUT, WRITE_POS, LENGTH, GEN_COUNT, BUDGET, TOP_K, SEED, ACTIVE, GREEDY = range(9)
# Columns of the fp32 slot-state matrix [S + 1, 2].
TEMPERATURE, TOP_P = range(2)


@dataclass(frozen=True)
class RunnerSettings:
    """Sizes fixed for the engine's lifetime (every buffer is allocated once from them)."""

    num_slots: int
    """S: sequences resident at once (running + cached prefixes)."""
    max_positions: int
    """M: positions per slot (the context limit, rounded up to a multiple of 16)."""
    max_new_tokens: int
    """G: generated tokens one slot can hold."""
    max_stop_ids: int
    """K: stop ids per row (EOS ids + the request's own)."""
    decode_buckets: tuple[int, ...]
    """Padded decode batch sizes, ascending; the last is the most rows decoded at once."""
    window_step: int
    """Key windows are multiples of this (the masked matmul reads only up to the longest live row, rounded up)."""
    use_cuda_graphs: bool
    compile: bool
    triton_kernels: bool = False
    """Attention and the unfiltered sampler by Triton kernels (CUDA): decode attention reads each row's own keys
    only (so one key window serves all), prefill attention reads keys in place (so a prefill step can be a CUDA
    graph), the sampler reads the logits once."""
    prefill_buckets: tuple[int, ...] = ()
    """Packed-token counts of the captured prefill graphs, ascending (with triton_kernels and CUDA graphs); the
    last bounds the tokens of one prefill step."""


@dataclass(frozen=True)
class PrefillChunk:
    """One row of a prefill step: compute `token_ids` at positions start..start+len-1 of `slot`."""

    slot: int
    token_ids: tuple[int, ...]
    start: int
    sample: bool
    """True when the chunk ends the row's context: the next token is sampled from its last position."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    seed: int = 0


@dataclass(frozen=True)
class ActiveRow:
    """A row entering decode: `input_token` (just sampled, generated index `num_generated - 1`) is fed next."""

    slot: int
    input_token: int
    input_logprob: float
    context_length: int
    """Tokens in the context including input_token (its position is context_length - 1)."""
    num_generated: int
    budget: int
    """The row finishes once it has generated this many tokens."""
    stop_ids: tuple[int, ...]
    temperature: float
    top_p: float
    top_k: int
    greedy: bool
    seed: int


def decode_buckets(max_rows: int) -> tuple[int, ...]:
    """Padded batch sizes up to max_rows (rounded up to 8): 8, 16, 32, then every 32, then every 64 past 256.

    Below 8 a decode step costs the same (it reads the weights either way), and one size-1 bucket would make
    the dynamic-shape compile specialise a second time.
    """
    top = -(-max_rows // 8) * 8
    sizes = {8, 16} | set(range(32, min(top, 256) + 1, 32)) | set(range(256, top + 1, 64))
    return tuple(sorted({min(size, top) for size in sizes} | {top}))


def prefill_buckets(max_tokens: int) -> tuple[int, ...]:
    """Packed-token counts of prefill graphs: 64, 128, then steps of x1.5 / x1.33 (256, 384, 512, 768, ...) up to
    max_tokens rounded up to 64, so a step pads at most half of its tokens (a third past 256)."""
    top = max(64, -(-max_tokens // 64) * 64)
    sizes, size = {64, 128}, 256
    while size < top:
        sizes |= {size, size * 3 // 2}
        size *= 2
    return tuple(sorted({s for s in sizes if s < top} | {top}))


class GraphRunner:
    """KV cache, slot state and the compiled/graphed step programs for one DecoderWeights."""

    def __init__(
        self,
        weights: DecoderWeights,
        rotary: tuple[torch.Tensor, float],
        settings: RunnerSettings,
        stop_pad: int = -1,
    ):
        shape, dtype, device = weights.shape, weights.dtype, weights.embed.device
        if settings.decode_buckets[-1] > settings.num_slots:
            raise ValueError(
                f"the largest decode bucket {settings.decode_buckets[-1]} exceeds {settings.num_slots} slots"
            )
        self.weights, self.settings, self.device = weights, settings, device
        slots, positions = settings.num_slots + 1, settings.max_positions  # + 1: the sink slot
        cache_shape = (slots, shape.num_kv_heads, positions, shape.head_dim)
        # Zeroed, not empty: padded rows read a few cache entries, and garbage bits could be NaN.
        self.k_caches = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(shape.num_layers)]
        self.v_caches = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(shape.num_layers)]
        inverse_frequencies, scaling = rotary
        self.cos, self.sin = rotary_tables(inverse_frequencies.to(device), scaling, positions, dtype)
        self.istate = torch.zeros(slots, 9, dtype=torch.long, device=device)
        self.istate[:, LENGTH] = 1
        self.fstate = torch.ones(slots, 2, dtype=torch.float32, device=device)
        self.stop_ids = torch.full((slots, settings.max_stop_ids), stop_pad, dtype=torch.long, device=device)
        self.out_tokens = torch.zeros(slots, settings.max_new_tokens, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(slots, settings.max_new_tokens, dtype=torch.float32, device=device)
        self.finished = torch.zeros(slots, dtype=torch.bool, device=device)
        self._row_index = torch.arange(slots, device=device)
        self._qkv: Callable[..., torch.Tensor] = layer_qkv
        self._rest: Callable[..., torch.Tensor] = decode_rest
        self._output: Callable[..., torch.Tensor] = layer_output
        self._sample_filtered: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sample_tokens
        if settings.compile:
            # Dynamic sizes: one compile serves every batch bucket, key window and prefill length.
            self._qkv = torch.compile(layer_qkv, dynamic=True)
            self._rest = torch.compile(decode_rest, dynamic=True)
            self._output = torch.compile(layer_output, dynamic=True)
            self._sample_filtered = torch.compile(sample_tokens, dynamic=True)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # Prefill with the Triton kernel: static inputs sized for the largest step (token ids, positions, slots,
        # one row each) and query blocks; each captured graph reads the first T columns and keeps its output.
        self._block_tokens = block_tokens(shape.num_heads, shape.num_kv_heads)
        self._max_prefill_chunks = settings.decode_buckets[-1]
        most_tokens = settings.prefill_buckets[-1] if settings.prefill_buckets else 0
        self._prefill_inputs = torch.zeros(3, most_tokens, dtype=torch.long, device=device)
        self._prefill_blocks = torch.zeros(
            max_query_blocks(most_tokens, self._max_prefill_chunks, self._block_tokens),
            3,
            dtype=torch.long,
            device=device,
        )
        self._prefill_inputs[2] = settings.num_slots  # until a step loads them: the sink slot
        self._prefill_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.compile_seconds = 0.0
        self.capture_seconds = 0.0

    @property
    def windows(self) -> tuple[int, ...]:
        step, top = self.settings.window_step, self.settings.max_positions
        if self.settings.triton_kernels:
            return (top,)
        return tuple(sorted({min(w, top) for w in range(step, top + step, step)}))

    def bucket_for(self, rows: int) -> int:
        """The smallest decode bucket holding `rows` rows."""
        return next(bucket for bucket in self.settings.decode_buckets if bucket >= rows)

    def window_for(self, length: int) -> int:
        """The smallest key window holding a context of `length` tokens."""
        return next(window for window in self.windows if window >= length)

    # -- decode ------------------------------------------------------------------------------------------
    def _decode_body(self, rows: int, window: int, filtered: bool) -> None:
        """One decode step for slots 0..rows-1 with keys 0..window-1, every effect written to device buffers."""
        weights, shape, sink = self.weights, self.weights.shape, self.settings.num_slots
        state = self.istate[:rows]
        active = state[:, ACTIVE].bool()
        write_positions, lengths = state[:, WRITE_POS], state[:, LENGTH]
        write_slots = torch.where(active, self._row_index[:rows], sink)
        key_mask = torch.arange(window, device=self.device)[None, :] < lengths[:, None]
        scale = shape.head_dim**-0.5
        splits = split_count(rows, shape.num_kv_heads, self.settings.max_positions)
        cos, sin = self.cos[write_positions], self.sin[write_positions]
        hidden = weights.embed[state[:, INPUT]]
        for index, layer in enumerate(weights.layers):
            k_cache, v_cache = self.k_caches[index], self.v_caches[index]
            q = self._qkv(
                hidden, *qkv_arguments(layer), cos, sin, k_cache, v_cache, write_slots, write_positions, shape
            )
            if self.settings.triton_kernels:
                attended = triton_decode_attention(q, k_cache, v_cache, lengths, scale, splits)
                hidden = self._output(hidden, attended, *rest_arguments(layer), shape)
            else:
                keys, values = k_cache[:rows, :, :window], v_cache[:rows, :, :window]
                hidden = self._rest(hidden, q, keys, values, key_mask, *rest_arguments(layer), shape)
        logits = output_logits(hidden, weights)
        fstate = self.fstate[:rows]
        tokens, logprobs = self._sample(
            logits,
            fstate[:, TEMPERATURE],
            fstate[:, TOP_P],
            state[:, TOP_K],
            state[:, GREEDY].bool(),
            state[:, SEED],
            lengths,  # the sampled token's index in its sequence keys its noise
            filtered,
        )
        self._advance(rows, active, tokens, logprobs)

    def _sample(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_p: torch.Tensor,
        top_k: torch.Tensor,
        greedy: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
        filtered: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample_tokens`, by the one-pass Triton race when no row filters (the same draws, far fewer bytes)."""
        if not filtered and self.settings.triton_kernels:
            return race_sample_tokens(logits, temperature, greedy, seeds, positions)
        return self._sample_filtered(logits, temperature, top_p, top_k, greedy, seeds, positions, filtered=filtered)

    def _advance(self, rows: int, active: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        state = self.istate[:rows]
        generated = state[:, GEN_COUNT]
        column = generated.clamp(max=self.settings.max_new_tokens - 1).unsqueeze(-1)
        self.out_tokens[:rows].scatter_(1, column, tokens.unsqueeze(-1))
        self.out_logprobs[:rows].scatter_(1, column, logprobs.unsqueeze(-1))
        generated = generated + active.long()
        stopped = (tokens.unsqueeze(-1) == self.stop_ids[:rows]).any(-1)
        done = active & (stopped | (generated >= state[:, BUDGET]))
        still = active & ~done
        self.finished[:rows] |= done  # sticky: the host may read it only after several steps
        state[:, GEN_COUNT] = generated
        state[:, ACTIVE] = still.long()
        state[:, INPUT] = torch.where(still, tokens, 0)
        state[:, WRITE_POS] = torch.where(still, state[:, LENGTH], 0)
        state[:, LENGTH] = torch.where(still, state[:, LENGTH] + 1, 1)

    def decode(self, rows: int, window: int, filtered: bool, steps: int = 1) -> list[int]:
        """Run `steps` decode steps back to back over slots 0..rows-1 (a bucket), then return the slots that
        finished in them: the only host synchronisation. A row that finishes early is inactive for the rest
        (its slot computes padding), and `window` must hold every live context after the last step."""
        graph = self._graphs.get((rows, window))
        for _ in range(steps):
            if graph is not None and not filtered:
                graph.replay()
            else:
                self._decode_body(rows, window, filtered)
        finished = self.finished[:rows].nonzero().squeeze(-1).tolist()
        if finished:
            self.finished[:rows] = False
        return finished

    def capture_graphs(self) -> None:
        """Compile (first call) and capture one CUDA graph per (bucket, window), while no row is active."""
        assert self.settings.use_cuda_graphs and self.device.type == "cuda"
        assert not bool(self.istate[:, ACTIVE].any()), "capture runs the step once; no row may be live"
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for rows in self.settings.decode_buckets:  # warm-up: compiles, picks GEMM kernels, allocates
                self._decode_body(rows, self.windows[-1], False)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.compile_seconds = time.perf_counter() - start
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        # Largest first, so smaller graphs reuse the pool blocks the largest one allocated.
        for rows in reversed(self.settings.decode_buckets):
            for window in reversed(self.windows):
                self._decode_body(rows, window, False)  # a first run at this shape, outside capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._decode_body(rows, window, False)
                self._graphs[(rows, window)] = graph
        prefill_pool = torch.cuda.graph_pool_handle()  # its outputs are read after replay: not shared with decode
        for num_tokens in reversed(self.settings.prefill_buckets):
            self._blocked_prefill(num_tokens)  # a first run at this shape, outside capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=prefill_pool):
                hidden = self._blocked_prefill(num_tokens)
            self._prefill_graphs[num_tokens] = (graph, hidden)
        torch.cuda.synchronize(self.device)
        self.finished.zero_()
        self.capture_seconds = time.perf_counter() - start

    # -- prefill -----------------------------------------------------------------------------------------
    def prefill(self, chunks: Sequence[PrefillChunk]) -> tuple[list[int], list[float]]:
        """Compute every chunk's K/V; sample one token for each chunk with `sample` (in order), returned to host."""
        lengths = [len(chunk.token_ids) for chunk in chunks]
        if self.settings.prefill_buckets:
            num_tokens = next(b for b in self.settings.prefill_buckets if b >= sum(lengths))
            self._load_prefill_inputs(chunks, num_tokens)
            if num_tokens in self._prefill_graphs:
                graph, hidden = self._prefill_graphs[num_tokens]
                graph.replay()
            else:
                hidden = self._blocked_prefill(num_tokens)
        else:
            batch = self._prefill_batch(chunks)
            hidden = prefill_forward(
                self.weights,
                self.k_caches,
                self.v_caches,
                self.cos,
                self.sin,
                batch.token_ids,
                batch.positions,
                batch.token_slots,
                lambda q, k_cache, v_cache: padded_prefill_attention(q, k_cache, v_cache, batch, self.weights.shape),
                self._qkv,
                self._output,
            )
        sampling = [chunk for chunk in chunks if chunk.sample]
        if not sampling:
            return [], []
        ends = torch.tensor(lengths, dtype=torch.long).cumsum(0) - 1
        # One copy each for the integer and the float columns of the sampled rows.
        integers = torch.tensor(
            [[c.top_k, int(c.greedy), c.seed, c.start + len(c.token_ids)] for c in sampling], dtype=torch.long
        )
        integers = torch.cat([integers, ends[[i for i, c in enumerate(chunks) if c.sample]][:, None]], dim=1)
        integers = integers.to(self.device).unbind(1)
        floats = torch.tensor([[c.temperature, c.top_p] for c in sampling], dtype=torch.float32).to(self.device)
        top_k, greedy, seeds, positions, last = integers
        logits = output_logits(hidden[last], self.weights)
        tokens, logprobs = self._sample(
            logits,
            floats[:, 0],
            floats[:, 1],
            top_k,
            greedy.bool(),
            seeds,
            positions,
            any(c.top_k > 0 or c.top_p < 1 for c in sampling),
        )
        return tokens.tolist(), logprobs.tolist()

    def _load_prefill_inputs(self, chunks: Sequence[PrefillChunk], num_tokens: int) -> None:
        """Write the chunks, padded to `num_tokens` tokens (sink slot, position 0), into the static prefill inputs."""
        if len(chunks) > self._max_prefill_chunks:
            raise ValueError(f"{len(chunks)} prefill chunks, more than the {self._max_prefill_chunks} rows sized for")
        padding = num_tokens - sum(len(chunk.token_ids) for chunk in chunks)
        sink = self.settings.num_slots
        inputs = torch.tensor(
            [
                [token for chunk in chunks for token in chunk.token_ids] + [0] * padding,
                [chunk.start + i for chunk in chunks for i in range(len(chunk.token_ids))] + [0] * padding,
                [chunk.slot for chunk in chunks for _ in chunk.token_ids] + [sink] * padding,
            ],
            dtype=torch.long,
        )
        blocks = query_blocks(
            [len(chunk.token_ids) for chunk in chunks],
            [chunk.slot for chunk in chunks],
            num_tokens,
            sink,
            self._block_tokens,
        )
        grid = max_query_blocks(num_tokens, self._max_prefill_chunks, self._block_tokens)
        table = torch.zeros(grid, 3, dtype=torch.long)
        table[: len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        self._prefill_inputs[:, :num_tokens].copy_(inputs)
        self._prefill_blocks[:grid].copy_(table)

    def _blocked_prefill(self, num_tokens: int) -> torch.Tensor:
        """[T, hidden] prefill of the static inputs' first T tokens with the Triton attention (what graphs capture)."""
        token_ids, positions, token_slots = self._prefill_inputs[:, :num_tokens]
        blocks = self._prefill_blocks[: max_query_blocks(num_tokens, self._max_prefill_chunks, self._block_tokens)]
        scale = self.weights.shape.head_dim**-0.5
        return prefill_forward(
            self.weights,
            self.k_caches,
            self.v_caches,
            self.cos,
            self.sin,
            token_ids,
            positions,
            token_slots,
            lambda q, k_cache, v_cache: triton_prefill_attention(q, k_cache, v_cache, positions, blocks, scale),
            self._qkv,
            self._output,
        )

    def _prefill_batch(self, chunks: Sequence[PrefillChunk]) -> PrefillBatch:
        lengths = [len(chunk.token_ids) for chunk in chunks]
        width = max(lengths)
        padded_index = torch.zeros(len(chunks), width, dtype=torch.long)
        packed_index, offset = [], 0
        for row, length in enumerate(lengths):
            padded_index[row, :length] = torch.arange(offset, offset + length)
            packed_index.extend(range(row * width, row * width + length))
            offset += length
        # Pad the packed tokens to a multiple of 8 (at least 8): a compiled step would specialise a second time on
        # a single row. Padding tokens write only to the sink slot.
        padding = max(8, -(-offset // 8) * 8) - offset
        ends = [chunk.start + length for chunk, length in zip(chunks, lengths, strict=True)]
        key_length = min(-(-max(ends) // 16) * 16, self.settings.max_positions)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=self.device)

        sink = self.settings.num_slots
        return PrefillBatch(
            token_ids=tensor([token for chunk in chunks for token in chunk.token_ids] + [0] * padding),
            positions=tensor(
                [chunk.start + i for chunk in chunks for i in range(len(chunk.token_ids))] + [0] * padding
            ),
            token_slots=tensor([chunk.slot for chunk in chunks for _ in chunk.token_ids] + [sink] * padding),
            slots=tensor([chunk.slot for chunk in chunks]),
            padded_index=padded_index.to(self.device),
            packed_index=tensor(packed_index),
            mask=prefill_mask(tensor([chunk.start for chunk in chunks]), tensor(ends), width, key_length),
            key_length=key_length,
        )

    # -- slot state --------------------------------------------------------------------------------------
    def activate(self, rows: Sequence[ActiveRow]) -> None:
        """Put rows into decode: their state, sampling settings and stop ids, and the just-sampled token."""
        if not rows:
            return
        slots = torch.tensor([row.slot for row in rows], dtype=torch.long, device=self.device)
        istate = torch.tensor(
            [
                [
                    row.input_token,
                    row.context_length - 1,
                    row.context_length,
                    row.num_generated,
                    row.budget,
                    row.top_k,
                    row.seed,
                    1,
                    int(row.greedy),
                ]
                for row in rows
            ],
            dtype=torch.long,
        )
        stops = torch.full((len(rows), self.settings.max_stop_ids), -1, dtype=torch.long)
        for index, row in enumerate(rows):
            stops[index, : len(row.stop_ids)] = torch.tensor(row.stop_ids, dtype=torch.long)
        self.istate.index_copy_(0, slots, istate.to(self.device))
        fstate = torch.tensor([[row.temperature, row.top_p] for row in rows], dtype=torch.float32)
        self.fstate.index_copy_(0, slots, fstate.to(self.device))
        self.stop_ids.index_copy_(0, slots, stops.to(self.device))
        columns = torch.tensor([row.num_generated - 1 for row in rows], dtype=torch.long, device=self.device)
        self.out_tokens[slots, columns] = torch.tensor([row.input_token for row in rows], device=self.device)
        self.out_logprobs[slots, columns] = torch.tensor(
            [row.input_logprob for row in rows], dtype=torch.float32, device=self.device
        )

    def deactivate(self, slots: Sequence[int]) -> None:
        """Take rows out of decode (their slot state becomes that of a padded row)."""
        if slots:
            index = torch.tensor(list(slots), dtype=torch.long, device=self.device)
            self.istate[index, ACTIVE] = 0
            self.istate[index, LENGTH] = 1
            self.istate[index, WRITE_POS] = 0

    def read_generated(self, slot: int) -> tuple[list[int], list[float]]:
        """The tokens and logprobs the row in `slot` generated so far."""
        return self.read_generated_many([slot])[0]

    def read_generated_many(self, slots: Sequence[int]) -> list[tuple[list[int], list[float]]]:
        """`read_generated` for several slots with three device reads in all (not three per slot)."""
        if not slots:
            return []
        index = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        counts = self.istate[index, GEN_COUNT].tolist()
        width = max(counts)
        tokens = self.out_tokens[index, :width].tolist()
        logprobs = self.out_logprobs[index, :width].tolist()
        return [(t[:n], p[:n]) for t, p, n in zip(tokens, logprobs, counts, strict=True)]

    def move(self, moves: Sequence[tuple[int, int]]) -> None:
        """Copy whole slots (KV of every layer, state, generated tokens) from src to dst; src becomes padding."""
        if not moves:
            return
        src = torch.tensor([m[0] for m in moves], dtype=torch.long, device=self.device)
        dst = torch.tensor([m[1] for m in moves], dtype=torch.long, device=self.device)
        for tensor in (*self.k_caches, *self.v_caches, self.istate, self.fstate, self.stop_ids):
            tensor.index_copy_(0, dst, tensor.index_select(0, src))
        for tensor in (self.out_tokens, self.out_logprobs):
            tensor.index_copy_(0, dst, tensor.index_select(0, src))
        self.deactivate([m[0] for m in moves])
