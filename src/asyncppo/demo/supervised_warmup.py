"""The supervised warm-up both demo policies share: AdamW with a linear ramp then cosine decay, on one thread.

Called by `demo/arithmetic_policy.py` (arithmetic answers) and `demo/tool_policy.py` (multi-turn tool plays),
which differ only in how a step's (input_ids, attention_mask, labels) batch is built.
"""

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(input_ids, attention_mask, labels) [B, S]; labels are -100 where no loss applies."""


def eos_and_pad(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """The tokenizer's eos and pad ids; ValueError when either is missing."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if not isinstance(eos, int) or not isinstance(pad, int):
        raise ValueError(f"the tokenizer needs an eos and a pad token, has eos={eos!r} pad={pad!r}")
    return eos, pad


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread, then back to the previous count.

    The kernels of a 93k-parameter model are too small to split across threads: on the shared 2-core machine
    one thread ran 100 warm-up steps in 3.9 s of CPU, two threads in 21-38 s (synchronisation and spinning).
    """
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(num_threads)


def supervised_warm_up(
    model: PreTrainedModel,
    batch_at: Callable[[int], Batch],
    *,
    num_steps: int,
    learning_rate: float,
    warmup_steps: int,
) -> float:
    """Train `model` on `batch_at(step)` for `num_steps` steps; returns the mean loss of the last 10% of steps.

    AdamW (betas 0.9 / 0.98, no weight decay), gradient norm clipped at 1, the learning rate ramped linearly over
    `warmup_steps` and decayed by a cosine to 0. The model is left in eval mode.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=0.0)

    def lr_factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup_steps)
        return ramp * 0.5 * (1.0 + math.cos(math.pi * step / num_steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    last_losses = []
    model.train()
    try:
        with one_thread():
            for step in range(num_steps):
                input_ids, attention_mask, labels = batch_at(step)
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                if step >= num_steps * 0.9:
                    last_losses.append(loss.item())
    finally:
        model.eval()
    return sum(last_losses) / max(len(last_losses), 1)
