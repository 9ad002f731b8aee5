from outbox import OutboxCategory, OutboxScope


class Category(OutboxCategory):
    ORGANIZATION_UPDATE = 1
    AUDIT_EVENT = 2
    USER_UPDATE = 3
    LEDGER_ENTRY = 4


class Scope(OutboxScope):
    ORGANIZATION = 0, {Category.ORGANIZATION_UPDATE, Category.AUDIT_EVENT, Category.LEDGER_ENTRY}
    USER = 1, {Category.USER_UPDATE}
