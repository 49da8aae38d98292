"""webhook adapter of kubeon-gpu-optimizer."""
