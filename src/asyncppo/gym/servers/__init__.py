"""Built-in gym servers (resources, simple agent, head) for tests and demos without a NeMo-Gym install."""
