"""controller adapter of kubeon-gpu-optimizer."""
