"""The uniqjob benchmark: cost per lock against the physical floor and peers.

Run it from the repository root as ``python -m benchmarks`` (``--help`` for the
options). It starts a private redis-server, times each operation in the same
rounds as its floor (on Redis the operation's own Lua scripts sent raw by
``client.evalsha``: ``redis_floor``, ``replay``; elsewhere a bare ``PING`` or a
bare ``filelock.FileLock`` cycle), counts Redis round trips, and prints
medians, ratios to the floor and whether each target is met.
It is a tool, never a timed test: the suite only checks that it runs.
"""
