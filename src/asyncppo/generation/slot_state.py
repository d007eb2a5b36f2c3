"""The graph runner's per-slot decode state, on the device: what each KV slot's row feeds, samples and generated.

`GraphRunner` (`generation/graph_runner.py`) owns one and its decode step reads and `advance`s it in place, so a
captured CUDA graph replays against it with no host work; `GraphEngine` activates rows after their prefill and
reads their tokens back once they finish. Letters: S slots (slot S is the sink padded rows write to), K stop
ids per row, G generated-token capacity per row.

    int64 state [S + 1, 9]   input token, write position, length, generated count, budget, top_k, seed, active, greedy
    fp32 state  [S + 1, 2]   temperature, top_p
    stop ids    [S + 1, K]   padded with -1
    generated   [S + 1, G]   token ids and their logprobs, one column per generated index
    finished    [S + 1]      sticky flags, the only thing the host reads after a decode step
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncppo.generation.graph_sampling import SamplingRows

# Columns of the int64 slot-state matrix [S + 1, 9].
INPUT, WRITE_POS, LENGTH, GEN_COUNT, BUDGET, TOP_K, SEED, ACTIVE, GREEDY = range(9)
# Columns of the fp32 slot-state matrix [S + 1, 2].
TEMPERATURE, TOP_P = range(2)


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


class SlotState:
    """The state tensors of `num_slots` slots plus the sink, allocated once; every update writes in place."""

    def __init__(
        self, num_slots: int, max_stop_ids: int, max_new_tokens: int, device: torch.device, stop_pad: int = -1
    ):
        slots = num_slots + 1  # + 1: the sink slot
        self.max_stop_ids, self.device = max_stop_ids, device
        self.istate = torch.zeros(slots, 9, dtype=torch.long, device=device)
        self.istate[:, LENGTH] = 1
        self.fstate = torch.ones(slots, 2, dtype=torch.float32, device=device)
        self.stop_ids = torch.full((slots, max_stop_ids), stop_pad, dtype=torch.long, device=device)
        self.out_tokens = torch.zeros(slots, max_new_tokens, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(slots, max_new_tokens, dtype=torch.float32, device=device)
        self.finished = torch.zeros(slots, dtype=torch.bool, device=device)

    def sampling_rows(self, rows: int) -> SamplingRows:
        """Slots 0..rows-1's sampling settings; the next token's index in its sequence (LENGTH) keys its noise."""
        state, fstate = self.istate[:rows], self.fstate[:rows]
        return SamplingRows(
            fstate[:, TEMPERATURE],
            fstate[:, TOP_P],
            state[:, TOP_K],
            state[:, GREEDY].bool(),
            state[:, SEED],
            state[:, LENGTH],
        )

    def advance(self, rows: int, active: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Record one sampled token per row of slots 0..rows-1, flag the rows it finishes, and step the live ones
        on (finished rows become padding: input 0 at position 0, length 1)."""
        state = self.istate[:rows]
        generated = state[:, GEN_COUNT]
        column = generated.clamp(max=self.out_tokens.shape[1] - 1).unsqueeze(-1)
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

    def take_finished(self, rows: int) -> list[int]:
        """The slots under `rows` flagged finished since the last call, flags cleared: a host synchronisation."""
        finished = self.finished[:rows].nonzero().squeeze(-1).tolist()
        if finished:
            self.finished[:rows] = False
        return finished

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
        stops = torch.full((len(rows), self.max_stop_ids), -1, dtype=torch.long)
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

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the state of slots `src` to slots `dst` ([n] long on the device); the caller deactivates src."""
        for tensor in (self.istate, self.fstate, self.stop_ids, self.out_tokens, self.out_logprobs):
            tensor.index_copy_(0, dst, tensor.index_select(0, src))
