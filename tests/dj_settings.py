"""Django settings of the tests' project (tests/test_django.py): a UniqueBackend over the env's choice.

``UNIQJOB_DJ_BACKEND``: ``db`` (django-tasks-db, SQLite file ``UNIQJOB_DJ_DB``) or ``rq``
(django-tasks-rq on ``UNIQJOB_DJ_REDIS``); the locks live in ``UNIQJOB_DJ_STORE``.
"""

import os
from typing import Any

import django  # type: ignore[import-untyped]

SECRET_KEY = "uniqjob tests"
USE_TZ = True
INSTALLED_APPS = [
    *(["django_tasks"] if django.VERSION < (6,) else []),  # the backport; Django 6 has django.tasks
    "django_tasks_db",
    *(["django_rq"] if os.environ.get("UNIQJOB_DJ_BACKEND") == "rq" else []),
    "uniqjob.integrations.django",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("UNIQJOB_DJ_DB", "")}}
_STORE = os.environ.get("UNIQJOB_DJ_STORE", "memory://")
_WRAPPED = {"db": "django_tasks_db.DatabaseBackend", "rq": "django_tasks_rq.RQBackend"}
TASKS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "uniqjob.integrations.django.UniqueBackend",
        "OPTIONS": {
            "backend": _WRAPPED[os.environ.get("UNIQJOB_DJ_BACKEND", "db")],
            "unique_backend": _STORE,
            "unique_lock_autoexpire": 3600,
            "unique_run_lease": 5,
        },
    },
}
_IMMEDIATE = "django.tasks.backends" if django.VERSION >= (6,) else "django_tasks.backends"
TASKS["immediate"] = {  # runs a task in enqueue, in this process: it cannot defer one
    "BACKEND": "uniqjob.integrations.django.UniqueBackend",
    "OPTIONS": {
        "backend": f"{_IMMEDIATE}.immediate.ImmediateBackend",
        "unique_backend": _STORE,
    },
}
RQ_QUEUES = {"default": {"URL": os.environ.get("UNIQJOB_DJ_REDIS", "redis://127.0.0.1:1/0")}}
if os.environ.get("UNIQJOB_DJ_MISTAKES"):  # one of each mistake the system checks report
    TASKS |= {
        "nothing_wrapped": {"BACKEND": "uniqjob.integrations.django.UniqueBackend"},
        "not_a_backend": {
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {"backend": "os.path"},
        },
        "bad_policy": {
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {"backend": _WRAPPED["db"], "unique_on_conflict": "shrug"},
        },
        "misspelt": {
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {"backend": _WRAPPED["db"], "unique_lock_autoexpiry": 60},
        },
        "bad_store": {
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {"backend": _WRAPPED["db"], "unique_backend": "s3://bucket"},
        },
        "cannot_park": {  # runs each task in enqueue: no worker frees a slot, none pushes a parked call
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {"backend": f"{_IMMEDIATE}.immediate.ImmediateBackend", "concurrency_limit": 1},
        },
    }
