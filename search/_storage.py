"""Optuna storages and samplers from plain settings (URLs, names, seeds).

RDB storages (SQLite, PostgreSQL, MySQL) are opened with Optuna's heartbeat: each worker records
a heartbeat for its in-flight trials, and any worker fails the trials whose heartbeat is older
than the grace period (a worker killed on another machine) and enqueues them again, so a study
still completes its budget. Creating the schema and the study is serialized by a database lock
(PostgreSQL advisory lock, MySQL ``GET_LOCK``) or retried (SQLite), so any number of workers may
start at once on an empty database.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import random
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna

logger = logging.getLogger(__name__)

#: Sampler names accepted by ``make_sampler``.
SAMPLERS = ("tpe", "nsga2", "random")

#: SQLAlchemy driver name -> (module to import, pip package that provides it).
_DRIVERS = {
    "psycopg": ("psycopg", "psycopg[binary]"),
    "psycopg2": ("psycopg2", "psycopg2-binary"),
    "pymysql": ("pymysql", "PyMySQL"),
    "mysqldb": ("MySQLdb", "mysqlclient"),
}
#: Drivers tried, in order, for a URL that names none (``postgresql://``, ``mysql://``).
_DEFAULT_DRIVERS = {"postgresql": ("psycopg", "psycopg2"), "mysql": ("pymysql", "mysqldb")}
_EXTRAS = {"postgresql": "postgres", "mysql": "mysql"}
#: RDB URLs whose schema this process has created or checked.
_SCHEMA_READY: set[str] = set()
#: Key of the database lock that serializes schema and study creation.
_LOCK_KEY = 0x6170_5F73_7475_6479 & 0x7FFF_FFFF_FFFF_FFFF  # "ap_study"


def database_url(url: str) -> str:
    """``url`` with an installed driver named: ``postgresql://`` (and ``postgres://``) -> psycopg 3
    or psycopg2, ``mysql://`` -> PyMySQL or mysqlclient, whichever is installed. A URL naming a
    driver that is not installed, or a bare URL with none installed, is a one-line error naming
    the package to install."""
    scheme, separator, rest = url.partition("://")
    dialect, _, driver = scheme.partition("+")
    dialect = {"postgres": "postgresql"}.get(dialect, dialect)
    if not separator or dialect not in _DEFAULT_DRIVERS:
        return url
    if driver:
        module, package = _DRIVERS.get(driver, (driver, driver))
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"storage ({redacted(url)}) needs the {driver} driver: pip install '{package}' "
                f"(or 'moe-autoparallel[{_EXTRAS[dialect]}]')"
            )
        return url
    for candidate in _DEFAULT_DRIVERS[dialect]:
        if importlib.util.find_spec(_DRIVERS[candidate][0]) is not None:
            return f"{dialect}+{candidate}://{rest}"
    raise ValueError(
        f"storage ({redacted(url)}) needs a {dialect} driver: pip install 'moe-autoparallel[{_EXTRAS[dialect]}]' "
        f"(or '{_DRIVERS[_DEFAULT_DRIVERS[dialect][0]][1]}')"
    )


def redacted(url: str | None) -> str | None:
    """The URL without its password (errors are printed and logged)."""
    if url is None:
        return None
    scheme, separator, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{separator}{credentials.split(':', 1)[0]}:***@{host}"


def open_storage(
    url: str | optuna.storages.BaseStorage | None,
    *,
    heartbeat_interval_s: int | None = 5,
    grace_period_s: int | None = 20,
    max_retry: int = 3,
) -> optuna.storages.BaseStorage | None:
    """An Optuna storage instance is used as given; ``None`` -> in-memory; ``sqlite:///study.db``
    or any SQLAlchemy URL -> an RDB storage with heartbeat (``heartbeat_interval_s``;
    ``grace_period_s`` without a heartbeat fails a trial; it is retried up to ``max_retry``
    times); ``journal:PATH`` (or a path ending in ``.log``/``.journal``) -> a journal file, which
    several processes (also on several machines sharing the file system) can append to."""
    if url is None or isinstance(url, optuna.storages.BaseStorage):
        return url
    if url.startswith("journal:") or url.endswith((".log", ".journal")):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = url.removeprefix("journal:")
        return JournalStorage(JournalFileBackend(path.removeprefix("///")))
    if "://" not in url:
        raise ValueError(
            f"storage ({url!r}) must be an RDB URL such as 'sqlite:///study.db', "
            f"'postgresql://user@host/db' or 'journal:PATH'"
        )
    url = database_url(url)
    engine_kwargs = _engine_options(url)
    # Tables created and their version checked once per process (a forked worker inherits it).
    ready: dict[str, Any] = (
        {"skip_table_creation": True, "skip_compatibility_check": True}
        if url in _SCHEMA_READY
        else {}
    )
    with warnings.catch_warnings():  # heartbeat and its retry callback are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        heartbeat = _heartbeat_options(heartbeat_interval_s, grace_period_s, max_retry)
        storage = _retry_creation(
            lambda: optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, **heartbeat, **ready
            )
        )
    _SCHEMA_READY.add(url)
    return storage


def _heartbeat_options(
    interval_s: int | None, grace_s: int | None, max_retry: int
) -> dict[str, Any]:
    if interval_s is None:
        return {}
    # Optuna >= 4.9 renamed the callback argument; accept both.
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    name = "heartbeat_stale_trial_callback" if retry is not None else "failed_trial_callback"
    retry = retry or optuna.storages.RetryFailedTrialCallback
    return {
        "heartbeat_interval": interval_s,
        "grace_period": grace_s,
        name: retry(max_retry=max_retry),
    }


def _retry_creation(create, *, attempts: int = 8):
    """``create()``, retried when another process created the same tables, types or rows at the
    same moment (PostgreSQL's ``CREATE TYPE`` race, SQLite's ``table already exists``)."""
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return create()
        except (
            sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.ProgrammingError,
            sqlalchemy.exc.OperationalError,
        ) as error:
            if attempt == attempts - 1 or not _is_creation_race(error):
                raise
            logger.info(
                "storage creation raced another worker (%s); retrying", type(error.orig).__name__
            )
            time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def _is_creation_race(error: Exception) -> bool:
    text = str(error).lower()
    words = ("already exists", "duplicate", "unique", "locked", "could not serialize")
    return any(word in text for word in words)


@contextlib.contextmanager
def creation_lock(url: str | optuna.storages.BaseStorage | None) -> Iterator[None]:
    """Hold a database-wide lock while the schema and the study are created or checked, so that
    workers starting together create them once (PostgreSQL ``pg_advisory_lock``, MySQL
    ``GET_LOCK``); other storages need none (in-memory, journal) or retry (SQLite)."""
    if not isinstance(url, str) or "://" not in url:
        yield
        return
    url = database_url(url)
    dialect = url.split("://", 1)[0].split("+", 1)[0]
    statements = {
        "postgresql": (
            f"SELECT pg_advisory_lock({_LOCK_KEY})",
            f"SELECT pg_advisory_unlock({_LOCK_KEY})",
        ),
        "mysql": (
            "SELECT GET_LOCK('autoparallel_study', 600)",
            "SELECT RELEASE_LOCK('autoparallel_study')",
        ),
    }.get(dialect)
    if statements is None:
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(statements[0]))
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text(statements[1]))
    finally:
        engine.dispose()


def close_storage(storage: optuna.storages.BaseStorage | None) -> None:
    """Close the storage's pooled connections (before ``fork()``: a child must open its own)."""
    backend: Any = getattr(storage, "_backend", storage)  # a study wraps an RDB storage in a cache
    engine = getattr(backend, "engine", None)
    if engine is not None:
        backend.scoped_session.remove()
        engine.dispose()


def _engine_options(url: str) -> dict[str, Any]:
    """SQLite: WAL connections (``_sqlite_creator``). PostgreSQL: ``synchronous_commit=off`` for
    the search's sessions — the same trade as SQLite's ``synchronous=NORMAL``: a commit returns
    once the server holds it, before the WAL reaches the disk, so a killed worker loses nothing
    and only a crash of the server machine could lose the last fraction of a second of trials
    (never consistency). Measured by ``benchmarks/search_workers.py``: a trial is ~11 commits, and
    with a flush per commit the storage, not the search, set the pace."""
    if url.startswith("sqlite:///"):
        return {"creator": _sqlite_creator(url)}
    if url.startswith("postgresql"):
        return {"connect_args": {"options": "-c synchronous_commit=off"}}
    return {}


def _sqlite_creator(url: str):
    """SQLite connections in WAL mode with ``synchronous=NORMAL``: a commit is durable once the
    process has written it (a killed process loses nothing; only a power loss could), readers do
    not block the writer, and commits skip the per-transaction fsync that otherwise dominates a
    trial (measured here: 17 ms per commit, ~20 commits per trial). Several processes on one
    machine can share the file; on a network file system use a server database instead."""
    import sqlite3

    path = url[len("sqlite:///") :]

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=60, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    return connect


def make_sampler(
    sampler: str | optuna.samplers.BaseSampler | None, *, seed: int, multi_objective: bool
) -> optuna.samplers.BaseSampler:
    """TPE (seeded, multivariate) by default; NSGA-II for two objectives; an Optuna sampler
    instance is used as given. TPE's constant liar is off: it triples the sampling time, and
    trials of one batch that land on the same mesh are priced once anyway."""
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    name = sampler or ("nsga2" if multi_objective else "tpe")
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=False, n_startup_trials=16
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=24)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler ({sampler!r}) must be one of {list(SAMPLERS)} or an optuna sampler")


def study_name_for(**identity: Any) -> str:
    """A stable name for a search problem, so that a resumed search finds its own study."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[
        :12
    ]
    return f"autoparallel-{identity.get('model', 'model')}-{identity.get('kind', '')}-{identity.get('world_size', '')}-{digest}"
