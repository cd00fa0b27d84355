"""The durable layer's fixtures: the engines' servers and system databases.

DBOS's `database` (SQLite, and PostgreSQL when installed), `launch` and `postgres` come
from _dbos.py, Temporal's `temporal_address` (its dev server) from _temporal.py; the chaos
suite's session servers from _durable_engines.py, which test_durable_chaos.py imports.
Each skips its test, saying what is missing (dbos, PostgreSQL, the `temporal` CLI).
"""

from _dbos import database, launch, postgres  # noqa: F401  (fixtures)
from _temporal import temporal_address  # noqa: F401  (a fixture)
