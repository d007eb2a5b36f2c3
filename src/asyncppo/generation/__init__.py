"""Layer 1: the Generator protocol and its backends (requests in, tokens and logprobs out)."""
