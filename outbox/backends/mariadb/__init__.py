"""The MariaDB backend (10.6 and later): a few statements per engine step.

- `backend`: `MariaDBBackend`;
- `statements`: every statement, named and rendered once per outbox table: finding and
  leasing the shards a claim takes, reading their rows, settling a round, renewing and
  releasing the lease, with the fragments they share (table names, JSON shard keys, the
  joins between rows, leases and keys), their parameters (shard keys and row ids as
  JSON) and the decoding of what they read.

Its transient lock errors are recognised in `outbox.backends.lock_errors`.
"""

from __future__ import annotations

from outbox.backends.mariadb.backend import MariaDBBackend

__all__ = ["MariaDBBackend"]
