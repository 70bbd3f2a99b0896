"""A throwaway PostgreSQL 15 server for the test session (initdb + pg_ctl, non-root, loopback)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("TWOCLOCKS_PG_BIN", "/usr/lib/postgresql/15/bin"))
PASSWORD = "tc-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


class PgServer:
    """Start with `start()`, stop with `stop()`; `url(db)` gives a psycopg URL with a password."""

    def __init__(self, max_connections: int = 200) -> None:
        self.max_connections = max_connections
        self.root = Path(tempfile.mkdtemp(prefix="twoclocks-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        # initdb refuses to run as root: use the `postgres` system user when we are root.
        self.user = None
        if os.geteuid() == 0:
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run(_as_user(list(cmd), self.user), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {proc.stdout}\n{proc.stderr}")

    def start(self) -> PgServer:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL binaries not found in {PG_BIN}")
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "tc", "--auth=scram-sha-256",
                  f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", self._opts(), "-w", "-t",
                  "30", "-l", str(self.root / "log"), "start")
        return self

    def _opts(self) -> str:
        # fsync off is safe here (the machine does not crash, the OS keeps the writes), but
        # synchronous_commit stays on: off, a commit is acknowledged before its WAL leaves the
        # server's memory, and `restart` (an immediate stop) loses it, so a test that restarts
        # the server under writers would see acknowledged rows vanish
        return (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c fsync=off "
                f"-c full_page_writes=off "
                f"-c max_connections={self.max_connections} "
                f"-c unix_socket_directories={self.root}")

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server at once (clients see their connections dropped), stay down `down_s`
        seconds, start it again on the same port and data."""
        import time

        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        time.sleep(down_s)
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", self._opts(), "-w", "-t",
                  "60", "-l", str(self.root / "log"), "start")

    def url(self, db: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql+psycopg://tc:{password}@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=tc password={PASSWORD} "
                             "dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(_as_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                                 "stop"], self.user), capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
