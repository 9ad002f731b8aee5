class ControlRouter:
    """Control-side tables live on the "control" database; every table exists on both."""

    control_models = {"outbox.controloutbox", "testapp.account"}

    def db_for_read(self, model, **hints):
        return "control" if model._meta.label_lower in self.control_models else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        return True
