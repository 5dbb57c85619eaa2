"""A throw-away PostgreSQL server for tests and benchmarks of the distributed search.

``PostgresServer.start()`` runs ``initdb`` in a fresh temporary folder and ``pg_ctl start`` on a
free port of 127.0.0.1 (Unix socket in the same folder), and ``stop()`` stops it and deletes the
folder. PostgreSQL refuses to run as root, so under root (CI) the server runs as the unprivileged
user ``nobody`` through ``runuser``. ``unavailable_reason()`` says why no server can be started
here (no server binaries, no driver), for a skip message.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

_SERVER_USER = "nobody"


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's
    ``/usr/lib/postgresql/<version>/bin``, newest version), or None."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3].split(".")[0]),
    )
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    """Why a server cannot be started here, or None when it can."""
    import importlib.util

    if server_binaries() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql"
    if not any(importlib.util.find_spec(m) for m in ("psycopg", "psycopg2")):
        return "no PostgreSQL driver: pip install 'moe-autoparallel[postgres]'"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL cannot run as root"
    return None


#: Starts tried before giving up on a port another process took between choice and bind.
_BIND_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """One running server; ``url(database)`` for its databases, ``create_database(name)``."""

    def __init__(self, *, folder: Path, port: int, binaries: Path) -> None:
        self.folder, self.port, self.binaries = folder, port, binaries

    @classmethod
    def start(cls, *, durable: bool = False, timeout_s: float = 60.0) -> PostgresServer:
        """A new server. ``durable=False`` turns fsync off (tests; a killed *server* may lose
        data, a killed client never does); benchmarks keep PostgreSQL's defaults."""
        binaries = server_binaries()
        if binaries is None:
            raise RuntimeError(unavailable_reason())
        folder = Path(tempfile.mkdtemp(prefix="autoparallel-pg-"))
        os.chmod(folder, 0o755)
        server = cls(folder=folder, port=_free_port(), binaries=binaries)
        if os.geteuid() == 0:
            shutil.chown(folder, user=_SERVER_USER)
        server._run(
            "initdb",
            "-D",
            str(folder / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        # The port is chosen before the server binds it: another process can take it in
        # between, so a start that fails to bind is retried on a fresh port.
        for attempt in range(_BIND_ATTEMPTS):
            try:
                server._start(durable=durable, timeout_s=timeout_s)
                break
            except RuntimeError as error:
                if "Address already in use" not in str(error) or attempt == _BIND_ATTEMPTS - 1:
                    raise
                server.port = _free_port()
        return server

    def _start(self, *, durable: bool, timeout_s: float) -> None:
        folder = self.folder
        options = f"-p {self.port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(
            "pg_ctl",
            "-D",
            str(folder / "data"),
            "-o",
            options,
            "-l",
            str(folder / "server.log"),
            "-w",
            "-t",
            str(int(timeout_s)),
            "start",
        )

    def _run(self, program: str, *arguments: str) -> None:
        command = [str(self.binaries / program), *arguments]
        if os.geteuid() == 0:
            command = ["runuser", "-u", _SERVER_USER, "--", *command]
        done = subprocess.run(command, check=False, capture_output=True, text=True, cwd=self.folder)
        if done.returncode:
            log = (
                (self.folder / "server.log").read_text()
                if (self.folder / "server.log").exists()
                else ""
            )
            raise RuntimeError(
                f"{program} failed ({done.returncode}): {done.stderr.strip()} {log[-2000:]}"
            )

    def url(self, database: str = "postgres") -> str:
        """The URL as a user types it (``postgresql://``; the search picks the installed driver)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        import sqlalchemy

        from search import database_url

        engine = sqlalchemy.create_engine(
            database_url(self.url()),
            isolation_level="AUTOCOMMIT",
            poolclass=sqlalchemy.pool.NullPool,
        )
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (immediately) and delete its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        finally:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    shutil.rmtree(self.folder)
                    break
                except OSError:
                    time.sleep(0.2)
