"""Layer 1: metric sinks (console, JSONL, TensorBoard, W&B, MLflow), plots and rollout dumps."""
