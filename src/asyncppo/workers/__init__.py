"""Layer 3: thin Ray workers (policy, value, generation) around plain classes, and their placement."""
