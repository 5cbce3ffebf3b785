"""Imported first by ``uniqjob/__init__.py``: keep this package's own directory off ``sys.path``.

``python -m uniqjob`` (or ``python uniqjob``) run inside the package directory
puts that directory first on ``sys.path``, where ``inspect.py`` and
``queue.py`` would stand in for the standard library's modules of those names
(the first ``import dataclasses`` then fails with an ImportError).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
