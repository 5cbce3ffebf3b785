"""``python -m uniqjob``: the same as the ``uniqjob`` command."""

from uniqjob.cli import main

raise SystemExit(main())
