"""Layer 1: single-turn rollouts, reward functions and reward penalties (the Trajectory record is in `types`)."""
