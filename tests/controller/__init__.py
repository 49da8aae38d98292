"""Controller tests: the frame (lease, policy sync, status), right-sizing, scale to zero."""
