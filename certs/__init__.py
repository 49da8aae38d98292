"""certs adapter of kubeon-gpu-optimizer."""
