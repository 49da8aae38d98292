"""simulator adapter of kubeon-gpu-optimizer."""
