"""The one edge that talks to the Kubernetes API: client configuration, watch caches, verbs."""
