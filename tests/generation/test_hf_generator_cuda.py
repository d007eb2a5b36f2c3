"""HFGenerator on a CUDA device: the same token-exactness as on CPU, in fp32 and bf16 (marker `gpu`)."""

from pathlib import Path

import pytest
import torch

from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import GenerationRequest, SamplingParams
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


# bf16 logits are rounded before the fp32 log-softmax on both sides, but the engine's incremental KV-cache
# attention and the recompute's full attention round differently, so bf16 only agrees to ~1e-1 nats.
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.bfloat16, 0.15)])
def test_cuda_logprobs_match_a_fresh_forward_across_prompt_lengths(
    tiny_dir: Path, dtype: torch.dtype, tolerance: float
) -> None:
    policy = load_policy(tiny_dir, dtype=dtype, device="cuda")
    engine = HFGenerator(
        policy,
        eos_token_ids=[EOS_TOKEN_ID],
        pad_token_id=PAD_TOKEN_ID,
        max_batch_size=64,
        device="cuda",
        seed=0,
        max_context_length=256,
    )
    prompts = [tuple(range(9, 9 + length)) for length in (1, 5, 33, 12)]
    results = engine.generate(
        [GenerationRequest(p, SamplingParams(temperature=0.7, max_new_tokens=40)) for p in prompts]
    )
    engine.close()
    for prompt, result in zip(prompts, results, strict=True):
        ids = torch.tensor([prompt + result.token_ids], device="cuda")
        with torch.no_grad():
            expected = token_logprobs(policy, ids, torch.ones_like(ids), 0.7)[0, len(prompt) :]
        torch.testing.assert_close(torch.tensor(result.logprobs, device="cuda"), expected, rtol=0, atol=tolerance)
