"""Multi-process stress runner and checker for the outbox engine (see stress/README.md)."""
