"""extender adapter of kubeon-gpu-optimizer."""
