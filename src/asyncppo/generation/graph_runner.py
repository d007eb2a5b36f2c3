"""The graph engine's device side: the KV cache, per-slot decode state, and the prefill and decode programs.

`GraphEngine` (`generation/graph_engine.py`) drives it between steps; nothing here decides what to run. The
slot state lives in `slot_state.py`, the packing of prefill chunks into tensors in `prefill_packing.py`.

    host (scheduler)                          device (this module)
    state.activate(rows) ------------------->  slot state: input token, positions, budget, sampling, stops
    prefill(chunks) --> packed forward ----->  KV written, first tokens sampled, returned to the host
    decode(B, W) --> graph replay ---------->  one token for slots 0..B-1: KV written, token sampled, stop and
                                               budget checked, state advanced, all on the device
    <------------- finished flags [B] -------  the only read-back per decode step
    state.read_generated(slot) <------------   a finished row's tokens and logprobs

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
    decode_rest,
    layer_output,
    layer_qkv,
    output_logits,
    padded_prefill_attention,
    prefill_forward,
    qkv_arguments,
    rest_arguments,
    rotary_tables,
)
from asyncppo.generation.decoder_weights import DecoderWeights
from asyncppo.generation.graph_sampling import SamplingRows, sample_tokens
from asyncppo.generation.prefill_attention import block_tokens, max_query_blocks, triton_prefill_attention
from asyncppo.generation.prefill_packing import (
    PrefillChunk,
    packed_token_columns,
    padded_prefill_batch,
    prefill_sampling,
    query_block_table,
)
from asyncppo.generation.race_sampling import race_sample_tokens
from asyncppo.generation.slot_state import ACTIVE, INPUT, LENGTH, WRITE_POS, SlotState


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


def decode_buckets(max_rows: int) -> tuple[int, ...]:
    """Padded batch sizes up to max_rows (rounded up to 8): 8, 16, 32, then every 32, then every 64 past 256.

    Below 8 a decode step costs the same (it reads the weights either way), and one size-1 bucket would make
    the dynamic-shape compile specialise a second time.
    """
    top = -(-max_rows // 8) * 8
    sizes = {8, 16} | set(range(32, min(top, 256) + 1, 32)) | set(range(256, top + 1, 64))
    return tuple(sorted({min(size, top) for size in sizes} | {top}))


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
        self.state = SlotState(settings.num_slots, settings.max_stop_ids, settings.max_new_tokens, device, stop_pad)
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
        state = self.state.istate[:rows]
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
        tokens, logprobs = self._sample(logits, self.state.sampling_rows(rows), filtered)
        self.state.advance(rows, active, tokens, logprobs)

    def _sample(self, logits: torch.Tensor, rows: SamplingRows, filtered: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample_tokens`, by the one-pass Triton race when no row filters (the same draws, far fewer bytes)."""
        if not filtered and self.settings.triton_kernels:
            return race_sample_tokens(logits, rows.temperature, rows.greedy, rows.seeds, rows.positions)
        return self._sample_filtered(logits, *rows, filtered=filtered)

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
        return self.state.take_finished(rows)

    def capture_graphs(self) -> None:
        """Compile (first call) and capture one CUDA graph per (bucket, window), while no row is active."""
        assert self.settings.use_cuda_graphs and self.device.type == "cuda"
        assert not bool(self.state.istate[:, ACTIVE].any()), "capture runs the step once; no row may be live"
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
        self.state.finished.zero_()
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
            batch = padded_prefill_batch(chunks, self.settings.num_slots, self.settings.max_positions, self.device)
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
        rows, last = prefill_sampling(chunks, self.device)
        logits = output_logits(hidden[last], self.weights)
        tokens, logprobs = self._sample(logits, rows, any(c.top_k > 0 or c.top_p < 1 for c in sampling))
        return tokens.tolist(), logprobs.tolist()

    def _load_prefill_inputs(self, chunks: Sequence[PrefillChunk], num_tokens: int) -> None:
        """Write the chunks, padded to `num_tokens` tokens (sink slot, position 0), into the static prefill inputs."""
        if len(chunks) > self._max_prefill_chunks:
            raise ValueError(f"{len(chunks)} prefill chunks, more than the {self._max_prefill_chunks} rows sized for")
        sink = self.settings.num_slots
        inputs = torch.tensor(packed_token_columns(chunks, num_tokens, sink), dtype=torch.long)
        table = query_block_table(chunks, num_tokens, sink, self._block_tokens, self._max_prefill_chunks)
        self._prefill_inputs[:, :num_tokens].copy_(inputs)
        self._prefill_blocks[: table.shape[0]].copy_(table)

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

    # -- slot moves -------------------------------------------------------------------------------------
    def move(self, moves: Sequence[tuple[int, int]]) -> None:
        """Copy whole slots (KV of every layer, state, generated tokens) from src to dst; src becomes padding."""
        if not moves:
            return
        src = torch.tensor([m[0] for m in moves], dtype=torch.long, device=self.device)
        dst = torch.tensor([m[1] for m in moves], dtype=torch.long, device=self.device)
        for tensor in (*self.k_caches, *self.v_caches):
            tensor.index_copy_(0, dst, tensor.index_select(0, src))
        self.state.move(src, dst)
        self.state.deactivate([m[0] for m in moves])
