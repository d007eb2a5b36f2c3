"""Layer 0: pure torch PPO math (advantage estimators, losses, critic and mismatch diagnostics); no I/O."""
