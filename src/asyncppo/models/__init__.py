"""Layer 0: policy and value models on Hugging Face transformers, and the tiny local test model."""
