"""Layer 0: the CPU demos' tasks and starting policies, resolved from `demo:<name>` model names by the trainer.

Each demo pairs a generated task (`arithmetic_task`, `tool_task`: problems, shipped splits, noisy
demonstrations) with a policy that is the tiny model after a supervised warm-up on them (`arithmetic_policy`
for `demo:arithmetic`, `tool_policy` for `demo:multi_step`), shipped built (`shipped.py`; another recipe is
built once into the model cache).
"""
