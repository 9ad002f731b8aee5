from outbox import OutboxCategory, OutboxScope


class Category(OutboxCategory):
    ORGANIZATION_UPDATE = 1


class Scope(OutboxScope):
    ORGANIZATION = 0, {Category.ORGANIZATION_UPDATE}
