"""The sessions layer: conversation stores on SQLite files and on a real `redis-server`.

Redis is started by tests/support.py's `redis_server` (skipped when it is not on PATH);
the Redis store needs the redis extra.
"""
