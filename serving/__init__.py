"""serving adapter of kubeon-gpu-optimizer."""
