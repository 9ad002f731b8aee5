"""The MariaDB fast path's SQL for the end of a round and for the lease: deleting the
delivered rows (`retire`), recording the failed ones (`record_attempts`), backing failed
shards off (`back_off`), releasing shards (`release`, `release_held`), renewing the lease
(`renew`) and listing the shards it still holds (`held`)."""

from __future__ import annotations

from outbox.backends.mariadb.fragments import Fragments


class SettleSql(Fragments):
    def _retire(self, held: bool) -> str:
        """Delete the delivered rows (%(ids)s: a JSON list, as an IN list of thousands would
        fall back to a table scan) if every shard delivered to is still ours: `held`
        checks that our lease rows are as many as the shards the lease works on
        (%(held)s, those delivered to among them), else the delivered shards (%(keys)s,
        %(shards)s of them) are counted among our lease rows. The count locks the lease
        rows it reads until the commit: no one takes them over meanwhile."""
        ours = f"""(SELECT COUNT(*) FROM {self.lease} WHERE `outbox` = %(label)s
            AND `token` = %(token)s) = %(held)s"""
        if not held:
            ours = f"""(SELECT COUNT(*) FROM {self.keys("keys", "k")}
                JOIN {self.lease} l ON {self.lease_of("l", "k", json=True)}
                    AND l.`token` = %(token)s) = %(shards)s"""
        return f"""DELETE o FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (`id` BIGINT PATH '$')) d
            JOIN {self.table} o ON o.`id` = d.`id` WHERE {ours}"""

    def _record_attempts(self) -> str:
        """Record a failed attempt on the failed and dead rows of held shards: their retry
        time or `dead_at`, and on a group's newest row the receivers done (NULL: keep)."""
        failures = (  # per group, then per row of the group
            "`error` LONGTEXT PATH '$[0]', `tb` LONGTEXT PATH '$[1]', `dead` INT PATH '$[2]', "
            "NESTED PATH '$[3][*]' COLUMNS (`id` BIGINT PATH '$[0]', "
            "`micros` BIGINT PATH '$[1]', `done` LONGTEXT PATH '$[2]')"
        )
        return f"""
            UPDATE JSON_TABLE(%(failures)s, '$[*]' COLUMNS ({failures})) f
            JOIN {self.table} o ON o.`id` = f.`id`
            JOIN {self.lease} l ON {self.lease_of("l", "o")} AND l.`token` = %(token)s
            SET o.`attempts` = o.`attempts` + 1,
                o.`scheduled_from` = IF(f.`dead`, o.`scheduled_from`, NOW(6)),
                o.`scheduled_for` = IF(f.`dead`, o.`scheduled_for`,
                                       NOW(6) + INTERVAL f.`micros` MICROSECOND),
                o.`dead_at` = IF(f.`dead`, NOW(6), NULL),
                o.`first_attempt_at` = COALESCE(o.`first_attempt_at`, NOW(6)),
                o.`last_attempt_at` = NOW(6), o.`last_error` = f.`error`,
                o.`last_traceback` = f.`tb`,
                o.`delivered_to` = COALESCE(f.`done`, o.`delivered_to`)"""

    def _back_off(self) -> str:
        """Failed shards keep their lease row without a holder until they may retry."""
        micros = ", `micros` BIGINT PATH '$[3]'"
        return f"""
            UPDATE {self.keys("keys", "k", micros)}
            JOIN {self.lease} l ON {self.lease_of("l", "k", json=True)}
            SET l.`token` = NULL, l.`expires_at` = NOW(6) + INTERVAL k.`micros` MICROSECOND
            WHERE l.`token` = %(token)s"""

    def _release(self) -> str:
        return f"""
            DELETE l FROM {self.keys("keys", "k")} JOIN {self.lease} l
            ON {self.lease_of("l", "k", json=True)} WHERE l.`token` = %(token)s"""

    def _release_held(self) -> str:
        """All our lease rows, if they are the %(held)s shards the lease works on."""
        return f"""
            DELETE FROM {self.lease} WHERE `outbox` = %(label)s AND `token` = %(token)s
            AND (SELECT COUNT(*) FROM {self.lease} WHERE `outbox` = %(label)s
                 AND `token` = %(token)s) = %(held)s"""

    def _renew(self) -> str:
        return f"""
            UPDATE {self.lease} SET `expires_at` = NOW(6) + INTERVAL %(micros)s MICROSECOND
            WHERE `outbox` = %(label)s AND `token` = %(token)s"""

    def _held(self) -> str:
        return f"""
            SELECT `region_name`, `shard_scope`, `shard_identifier` FROM {self.lease}
            WHERE `outbox` = %(label)s AND `token` = %(token)s"""
