"""Every SQL statement of the MariaDB fast path, named, rendered once per outbox table
from the claim (`claim_sql`), read (`read_sql`) and settle (`settle_sql`) SQL, which
build on the shared `fragments`."""

from __future__ import annotations

from functools import cache

from outbox.backends.mariadb.claim_sql import ClaimSql
from outbox.backends.mariadb.fragments import Regions
from outbox.backends.mariadb.read_sql import ReadSql
from outbox.backends.mariadb.settle_sql import SettleSql
from outbox.models import OutboxBase


@cache
def statements(model: type[OutboxBase], regions: Regions) -> Statements:
    return Statements(model, regions)


class Statements(ClaimSql, ReadSql, SettleSql):
    """The named statements for one outbox table: rendered once, but for those that
    inline integers (`walk`, `claim_keys`: filters) or vary with the count of shards
    read apart (`read_arms`)."""

    def __init__(self, model: type[OutboxBase], regions: Regions) -> None:
        super().__init__(model, regions)
        self.take = self._take()  # lease the due, free shards found
        self.read_small = {timed: self._read_small(timed) for timed in (False, True)}
        self.read_window = {timed: self._read_window(timed) for timed in (False, True)}
        self.retire = {held: self._retire(held) for held in (False, True)}
        self.record_attempts = self._record_attempts()
        self.back_off = self._back_off()
        self.release = self._release()
        self.release_held = self._release_held()
        self.renew = self._renew()
        self.held = self._held()
