"""The MariaDB backend (10.6 and later): a few statements per engine step.

- `backend`: `MariaDBBackend`;
- `statements`: every statement, named and rendered once per outbox table: finding and
  leasing the shards a claim takes, reading their rows, settling a round, renewing and
  releasing the lease, with the fragments they share (table names, JSON shard keys, the
  joins between rows, leases and keys);
- `params`: their parameters (shard keys and row ids as JSON) and the decoding of what
  they read;
- `errors`: which errors are transient lock errors.
"""

from __future__ import annotations

from outbox.backends.mariadb.backend import MariaDBBackend

__all__ = ["MariaDBBackend"]
