"""Turn-level GAE (`turn_gae`): turn spans from message logs, the turn TD recursion and turn metrics.

Called by `advantages.compute_advantages` when the estimator is `turn_gae`; `build_turn_spans` is called where
trajectories are batched. Shapes: B batch, S sequence positions, K turn slots (K >= 1).

Turn MDP: state s_k = context before the k-th non-empty assistant message, action = that whole message,
r_k = 0 except r_K = R (plus the per-token KL penalty summed into its turn). Because values are right-shifted,
V(s_k) = values[anchor_k] with anchor_k = the first token of assistant message k.

    message logs --build_turn_spans--> TurnSpans --gather at anchors--> V [B,K] --gae_recursion--> A, G [B,K]
        A: broadcast to every token of its turn [B,S];  G: written at anchors only [B,S] (critic mask = anchors)
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncppo.algorithms.gae import gae_recursion

ASSISTANT_ROLE = "assistant"


@dataclass(frozen=True)
class TurnSpans:
    """Where the turns of a right-padded batch sit.

    anchor_mask  [B, S] bool: first token of each turn.
    turn_index   [B, S] long: turn ordinal of the token, -1 outside every turn.
    anchor_pos   [B, K] long: anchor position per turn slot, 0 in invalid slots.
    turn_valid   [B, K] bool: slot k < num_turns.
    num_turns    [B]    long.
    turn_ntokens [B, K] long: tokens in each turn, 0 in invalid slots.
    """

    anchor_mask: torch.Tensor
    turn_index: torch.Tensor
    anchor_pos: torch.Tensor
    turn_valid: torch.Tensor
    num_turns: torch.Tensor
    turn_ntokens: torch.Tensor

    def to(self, device: torch.device | str) -> "TurnSpans":
        return TurnSpans(
            anchor_mask=self.anchor_mask.to(device),
            turn_index=self.turn_index.to(device),
            anchor_pos=self.anchor_pos.to(device),
            turn_valid=self.turn_valid.to(device),
            num_turns=self.num_turns.to(device),
            turn_ntokens=self.turn_ntokens.to(device),
        )


def build_turn_spans(message_logs: Sequence[Sequence[tuple[str, int]]], seq_len: int) -> TurnSpans:
    """Turn spans of a batch from per-sample message logs of (role, num_tokens), in flattening order.

    Every non-empty assistant message is one turn (consecutive assistant messages are separate turns); its
    anchor is its first token. Raises ValueError for a log longer than `seq_len`, an assistant message at token
    position 0 (no state before it) and negative token counts.
    """
    per_sample: list[list[tuple[int, int]]] = []
    for sample, log in enumerate(message_logs):
        position = 0
        turns: list[tuple[int, int]] = []
        for message, (role, num_tokens) in enumerate(log):
            if num_tokens < 0:
                raise ValueError(f"sample {sample} message {message}: num_tokens={num_tokens} is negative")
            if role == ASSISTANT_ROLE and num_tokens > 0:
                if position == 0:
                    raise ValueError(
                        f"sample {sample} message {message}: assistant message at token position 0 has no state "
                        "before it to read V(s_k) from; the log must start with a prompt"
                    )
                turns.append((position, num_tokens))
            position += num_tokens
        if position > seq_len:
            raise ValueError(f"sample {sample}: message log flattens to {position} tokens > seq_len={seq_len}")
        per_sample.append(turns)

    batch_size = len(per_sample)
    num_slots = max([1, *(len(turns) for turns in per_sample)])
    anchor_mask = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    turn_index = torch.full((batch_size, seq_len), -1, dtype=torch.long)
    anchor_pos = torch.zeros(batch_size, num_slots, dtype=torch.long)
    turn_ntokens = torch.zeros(batch_size, num_slots, dtype=torch.long)
    for sample, turns in enumerate(per_sample):
        for k, (start, num_tokens) in enumerate(turns):
            anchor_mask[sample, start] = True
            turn_index[sample, start : start + num_tokens] = k
            anchor_pos[sample, k] = start
            turn_ntokens[sample, k] = num_tokens
    num_turns = torch.tensor([len(turns) for turns in per_sample], dtype=torch.long)
    turn_valid = torch.arange(num_slots).unsqueeze(0) < num_turns.unsqueeze(1)
    return TurnSpans(anchor_mask, turn_index, anchor_pos, turn_valid, num_turns, turn_ntokens)


def validate_turn_spans(
    spans: TurnSpans, token_mask: torch.Tensor, sample_mask: torch.Tensor | None = None
) -> dict[str, float]:
    """Check spans against the response mask `[B, S]`; returns {"turn/num_samples_without_turns": n}.

    Errors: shape mismatch, an anchor outside `token_mask`, a response token that belongs to no turn.
    An unmasked sample (`sample_mask` `[B]` > 0) with zero turns is only reported (metric and warning).
    """
    if spans.turn_index.shape != token_mask.shape:
        raise ValueError(
            f"turn spans cover {tuple(spans.turn_index.shape)} but token_mask is {tuple(token_mask.shape)}"
        )
    response = token_mask.bool()
    outside = spans.anchor_mask & ~response
    if outside.any():
        sample, position = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"turn anchor at sample {sample} position {position} lies outside the token mask")
    orphan = response & (spans.turn_index < 0)
    if orphan.any():
        sample, position = (int(i) for i in orphan.nonzero()[0])
        raise ValueError(f"response token at sample {sample} position {position} belongs to no assistant turn")
    unmasked = torch.ones_like(spans.num_turns, dtype=torch.bool) if sample_mask is None else sample_mask > 0
    without_turns = int(((spans.num_turns == 0) & unmasked).sum().item())
    if without_turns:
        warnings.warn(f"{without_turns} unmasked samples have no assistant turn", stacklevel=2)
    return {"turn/num_samples_without_turns": float(without_turns)}


def gather_turn_values(values: torch.Tensor, spans: TurnSpans) -> torch.Tensor:
    """V(s_k) = values[anchor_k]: `[B, S]` -> `[B, K]`, 0 in invalid slots."""
    return values.gather(1, spans.anchor_pos) * spans.turn_valid


def scatter_turns_to_tokens(per_turn: torch.Tensor, spans: TurnSpans) -> torch.Tensor:
    """`[B, K]` -> `[B, S]`: every token of turn k gets per_turn[k]; tokens outside every turn get 0."""
    in_turn = spans.turn_index >= 0
    return per_turn.gather(1, spans.turn_index.clamp(min=0)) * in_turn


def scatter_turns_to_anchors(per_turn: torch.Tensor, spans: TurnSpans) -> torch.Tensor:
    """`[B, K]` -> `[B, S]`: per_turn[k] at anchor_k, 0 elsewhere (invalid slots add 0 at position 0)."""
    out = torch.zeros(spans.anchor_mask.shape, dtype=per_turn.dtype, device=per_turn.device)
    return out.scatter_add(1, spans.anchor_pos, per_turn * spans.turn_valid)


def turn_rewards(
    rewards: torch.Tensor,
    spans: TurnSpans,
    token_mask: torch.Tensor,
    kl_penalty: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Turn rewards `[B, K]`: r_k = R * [k == last valid turn] - sum_{t in turn k} p_t * m_t.

    `rewards` `[B]`; `kl_penalty` `[B, S]` is the per-token KL-in-reward penalty. A sample with no turn has
    no action to credit, so its reward does not appear.
    """
    batch_size, num_slots = spans.turn_valid.shape
    last_turn = (spans.num_turns - 1).clamp(min=0)
    terminal = rewards.to(dtype) * (spans.num_turns > 0)
    out = torch.zeros(batch_size, num_slots, dtype=dtype, device=rewards.device)
    out = out.scatter(1, last_turn.unsqueeze(1), terminal.unsqueeze(1))
    if kl_penalty is not None:
        in_turn = (spans.turn_index >= 0) & token_mask.bool()
        penalty = kl_penalty.to(dtype) * in_turn
        out = out.scatter_add(1, spans.turn_index.clamp(min=0), -penalty)
    return out


@dataclass(frozen=True)
class TurnGAEResult:
    """advantages `[B, S]` (constant within a turn), returns `[B, S]` (anchors only), per-turn tensors `[B, K]`."""

    advantages: torch.Tensor
    returns: torch.Tensor
    turn_advantages: torch.Tensor
    turn_returns: torch.Tensor
    turn_values: torch.Tensor


def turn_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    spans: TurnSpans,
    token_mask: torch.Tensor,
    gamma: float,
    lambda_value: float,
    lambda_policy: float,
    kl_penalty: torch.Tensor | None = None,
) -> TurnGAEResult:
    """Turn-level GAE over valid turn slots, carry-forward over invalid ones:

        delta_k = r_k + gamma * V(s_{k+1}) - V(s_k),  V(s_{K+1}) = 0
        A_k     = delta_k + gamma * lambda * A_{k+1}
        G_k     = A_k(lambda_value) + V(s_k);  advantages = A_k(lambda_policy)

    `rewards` `[B]`, `values` `[B, S]` (right-shifted), `kl_penalty` `[B, S]`. Scalar lambdas only (no
    length-adaptive lambda: the turn horizon is already short). The recursion runs once when they coincide.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"adv_estimator.turn_gae_gamma={gamma} must lie in [0, 1]")
    for key, lam in (("turn_gae_lambda_value", lambda_value), ("turn_gae_lambda_policy", lambda_policy)):
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"adv_estimator.{key}={lam} must lie in [0, 1]")
    dtype = torch.promote_types(values.dtype, torch.float32)
    turn_values = gather_turn_values(values.to(dtype), spans)
    turn_r = turn_rewards(rewards, spans, token_mask, kl_penalty, dtype)
    value_advantages = gae_recursion(turn_r, turn_values, spans.turn_valid, gamma, lambda_value)
    turn_returns = (value_advantages + turn_values) * spans.turn_valid
    if lambda_policy == lambda_value:
        turn_advantages = value_advantages
    else:
        turn_advantages = gae_recursion(turn_r, turn_values, spans.turn_valid, gamma, lambda_policy)
    return TurnGAEResult(
        advantages=scatter_turns_to_tokens(turn_advantages, spans),
        returns=scatter_turns_to_anchors(turn_returns, spans),
        turn_advantages=turn_advantages,
        turn_returns=turn_returns,
        turn_values=turn_values,
    )


def turn_metrics(
    turn_values: torch.Tensor, turn_advantages: torch.Tensor, spans: TurnSpans, sample_mask: torch.Tensor
) -> dict[str, float]:
    """Turn statistics over valid turns of unmasked samples (`sample_mask` `[B]` > 0); empty below 2 turns.

    critic/turn_value_mean|std (V(s_k) the estimator consumed), advantage/turn_abs_mean_prenorm,
    advantage/turn_std_prenorm (pre-whitening A_k), turn/num_turns_mean|max (per unmasked sample),
    turn/tokens_per_turn_mean, turn/total_turns. Standard deviations are biased (population).
    """
    unmasked = sample_mask > 0
    valid = spans.turn_valid & unmasked.unsqueeze(1)
    total = int(valid.sum().item())
    if total < 2:
        return {}
    values = turn_values[valid].double()
    advantages = turn_advantages[valid].double()
    num_turns = spans.num_turns[unmasked].double()
    return {
        "critic/turn_value_mean": values.mean().item(),
        "critic/turn_value_std": values.std(correction=0).item(),
        "advantage/turn_abs_mean_prenorm": advantages.abs().mean().item(),
        "advantage/turn_std_prenorm": advantages.std(correction=0).item(),
        "turn/num_turns_mean": num_turns.mean().item(),
        "turn/num_turns_max": num_turns.max().item(),
        "turn/tokens_per_turn_mean": spans.turn_ntokens[valid].double().mean().item(),
        "turn/total_turns": float(total),
    }
