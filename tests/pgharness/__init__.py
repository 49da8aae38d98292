"""A real PostgreSQL server for tests: Debian's postgresql binaries, a fresh cluster in a temp dir.

`PostgresServer.start()` runs initdb and pg_ctl on 127.0.0.1 and a free port,
as the `postgres` system user when the tests run as root (PostgreSQL refuses
to run as root), and `stop()` removes it. `available()` says whether the
binaries are installed; tests fail rather than skip under CI=true
(scripts/install-test-deps.sh installs the `postgresql` package).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from tests.loopback import free_port

USER = "postgres"


def bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def available() -> bool:
    return bindir() is not None


def _as_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", USER, "--", *cmd]


@dataclass
class PostgresServer:
    directory: str
    port: int
    bin: str

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/hub"

    @classmethod
    def start(cls) -> PostgresServer:
        binaries = bindir()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        directory = tempfile.mkdtemp(prefix="kubeon-pg-")
        if os.geteuid() == 0:
            shutil.chown(directory, USER, USER)
        data = os.path.join(directory, "data")
        subprocess.run(_as_user([f"{binaries}/initdb", "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8",
                                 "--no-sync"]), check=True, capture_output=True)
        port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=off"
        subprocess.run(_as_user([f"{binaries}/pg_ctl", "-D", data, "-o", options, "-l",
                                 os.path.join(directory, "log"), "-w", "-t", "60", "start"]),
                       check=True, capture_output=True)
        server = cls(directory, port, binaries)
        subprocess.run(_as_user([f"{binaries}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", USER, "hub"]),
                       check=True, capture_output=True)
        return server

    def fresh_database(self, name: str) -> str:
        """A new empty database on this server, by URL."""
        subprocess.run(_as_user([f"{self.bin}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                                 name]), check=True, capture_output=True)
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(_as_user([f"{self.bin}/pg_ctl", "-D", os.path.join(self.directory, "data"), "-m", "fast",
                                 "-w", "stop"]), capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)
