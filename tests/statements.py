"""Capturing the statements a drain sends on every connection it uses."""

import threading
from contextlib import contextmanager

from django.db import connection
from django.db.backends.signals import connection_created


@contextmanager
def statements_by_thread(whole=False):
    """The statements run on the default database, by the name of the thread that ran
    them: on this thread's connection and on any connection opened meanwhile. Each is
    its first word, or with `whole` its whole text."""
    seen: list[tuple[str, str]] = []
    wrapped = []

    def record(execute, sql, params, many, context):
        text = sql if whole else sql.split(None, 1)[0].upper()
        seen.append((threading.current_thread().name, text))
        return execute(sql, params, many, context)

    def opened(sender, connection, **kwargs):
        if connection.alias == "default":
            connection.execute_wrappers.append(record)
            wrapped.append(connection)

    connection_created.connect(opened)
    try:
        with connection.execute_wrapper(record):
            yield seen
    finally:
        connection_created.disconnect(opened)
        for other in wrapped:  # a connection kept open by a thread (the lease keeper's)
            if record in other.execute_wrappers:
                other.execute_wrappers.remove(record)
