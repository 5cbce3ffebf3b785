"""One leg of the Redis section, in a process of its own: ``python -m benchmarks.redis_leg``.

Arguments: URL ITERATIONS WARMUP COUNTED [--no-hiredis]. Prints the leg's rows
as JSON (``benchmarks.redis_floor.leg``). With ``--no-hiredis`` the hiredis
module is blocked before redis-py is imported, so redis-py finds none and
parses replies in Python, as on a machine without hiredis installed.
"""

import json
import sys

if __name__ == "__main__":
    if "--no-hiredis" in sys.argv:
        sys.modules["hiredis"] = None  # type: ignore[assignment]  # import hiredis: ImportError
    from benchmarks.redis_floor import leg

    url, iterations, warmup, counted = sys.argv[1:5]
    print(json.dumps(leg(url, int(iterations), int(warmup), int(counted)), allow_nan=False))
