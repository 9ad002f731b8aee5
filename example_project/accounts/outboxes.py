"""The project's outbox scopes and categories.

A shard is (scope, shard_identifier): messages of one shard are delivered one at a time,
in order. Everything about an organization (its own updates, its projects, its audit log)
is in the ORGANIZATION scope with the organization's id as shard, so a project update can
never overtake the creation or deletion of its organization.
"""

from outbox import OutboxCategory, OutboxScope


class Category(OutboxCategory):
    ORGANIZATION_UPDATE = 1
    PROJECT_UPDATE = 2
    AUDIT_LOG_EVENT = 3
    USER_UPDATE = 10


class Scope(OutboxScope):
    ORGANIZATION = (
        0,
        {
            Category.ORGANIZATION_UPDATE,
            Category.PROJECT_UPDATE,
            Category.AUDIT_LOG_EVENT,
        },
    )
    USER = 1, {Category.USER_UPDATE}
