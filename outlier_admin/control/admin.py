"""The Django admin (mounted at ``/admin/``) changes roles only through the audited action.

A user's roles are Django groups named after :data:`outlier_admin.fleet.roles.ROLES`. The stock
user form would save them as a plain many-to-many write, with no audit event: here the form's role
groups are handed to :func:`~outlier_admin.control.actions.do_set_roles` instead (``user.roles``,
actor: the admin user), and only the other groups are saved the stock way. Creating a user in the
admin then setting its roles is audited the same way.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from outlier_admin.control.actions import do_set_roles
from outlier_admin.fleet.roles import ROLES

User = get_user_model()


class AuditedRolesUserAdmin(UserAdmin):
    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        groups = form.cleaned_data.get("groups")
        if groups is None:  # the add form has no groups field: nothing about roles to record
            super().save_related(request, form, formsets, change)
            return
        wanted = sorted({g.name for g in groups if g.name in ROLES})
        # The stock save keeps the user's current role groups; the action moves them and audits.
        current = list(form.instance.groups.filter(name__in=ROLES))
        form.cleaned_data["groups"] = [g for g in groups if g.name not in ROLES] + current
        super().save_related(request, form, formsets, change)
        do_set_roles(form.instance, wanted, actor=request.user, reason="changed in the Django admin")


if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, AuditedRolesUserAdmin)
