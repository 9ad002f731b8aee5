"""The exit statuses of the outbox's management commands, one table for all of them
(docs/reference/commands.md shows it):

- 0: done; also a stop that was asked for (SIGTERM/SIGINT) and a loop that ran its time;
- 1: a command error (Django's `CommandError`: an unknown table or database, a bad value);
- 2: a usage error (argparse: an unknown option, a value of the wrong type);
- 3: a one-shot drain left failed deliveries for a retry (not those that asked for it
  with `RetryLater`);
- 4: a drain stopped with a receiver still running (its shard's lease expires);
- 5: too many receiver calls stuck past the timeout: restart the process;
- 6: a threshold was passed (`outbox_status --max-...`).
"""

FAILED = 3
ABANDONED = 4
STUCK = 5
UNHEALTHY = 6
