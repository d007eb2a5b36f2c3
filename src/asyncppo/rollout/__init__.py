"""Layer 1: the Trajectory record, single-turn rollouts and reward functions."""
