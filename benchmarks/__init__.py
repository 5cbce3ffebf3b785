"""The uniqjob benchmark: cost per lock against the physical floor and peers.

Run it from the repository root as ``python -m benchmarks`` (``--help`` for the
options). It starts a private redis-server, times each operation alternately
with its floor (a bare ``PING``, or a bare ``filelock.FileLock`` cycle), and
prints medians, p99s, ratios to the floor and whether each target is met.
It is a tool, never a timed test: the suite only checks that it runs.
"""
