"""Admin views of the example's models (the outbox app registers its own tables)."""

from django.contrib import admin

from accounts import models

admin.site.register(models.Organization, list_display=["id", "name", "plan", "version"])
admin.site.register(
    models.Project, list_display=["id", "organization", "name", "status", "version"]
)
admin.site.register(
    models.AuditLogEntry, list_display=["id", "organization_id", "event", "created_at"]
)
admin.site.register(models.UserAccount, list_display=["id", "email", "region", "version"])
admin.site.register(models.OrganizationMirror, list_display=["id", "name", "plan", "version"])
admin.site.register(models.ProjectMirror, list_display=["id", "organization", "name", "version"])
admin.site.register(models.UserMirror, list_display=["id", "region", "user_id", "email", "version"])
admin.site.register(models.WebhookCall, list_display=["id", "endpoint", "object_id", "created_at"])
