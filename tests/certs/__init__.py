"""TLS material and certs CLI tests."""
