"""The Django app of uniqjob's integration (for ``manage.py uniqjob_locks``): put it in INSTALLED_APPS."""

from django.apps import AppConfig  # type: ignore[import-untyped]


class UniqjobConfig(AppConfig):  # type: ignore[misc]  # Django ships no type information
    """``"uniqjob.integrations.django"`` in INSTALLED_APPS: its management commands."""

    name = "uniqjob.integrations.django"
    label = "uniqjob"
    verbose_name = "uniqjob"
