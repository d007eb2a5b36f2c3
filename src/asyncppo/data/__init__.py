"""Layer 0: datasets and data loaders (JSONL and local Hugging Face files, stateful loading)."""
