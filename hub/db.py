"""The hub's tables (SQLAlchemy 2) and how a database is opened and migrated (alembic).

SQLite by default (`sqlite:///hub.db`), PostgreSQL by URL (`postgresql+psycopg://...`).
The schema is owned by the migrations in hub/migrations/versions; `open_db`
upgrades to head before anything reads, so a new release migrates on start.
Times are stored as UTC epoch seconds (floats): the same on both engines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
log = logging.getLogger(__name__)


class Base(DeclarativeBase):
    pass


class Cluster(Base):
    __tablename__ = "clusters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    revision: Mapped[int] = mapped_column(Integer, default=0)
    last_poll_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_poll_result: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Token(Base):
    """A cluster token, stored as its SHA-256 only. state: active | previous | revoked."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    first_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Policy(Base):
    __tablename__ = "policies"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(253))
    spec: Mapped[str] = mapped_column(Text)  # JSON
    updated_at: Mapped[float] = mapped_column(Float)


class Approval(Base):
    __tablename__ = "approvals"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    policy: Mapped[str] = mapped_column(String(253))
    target: Mapped[str] = mapped_column(String(800))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    withdrawn: Mapped[bool] = mapped_column(Boolean, default=False)


class Action(Base):
    """One action an optimizer reported; (cluster, action id) is unique: exactly once in the log."""

    __tablename__ = "actions"
    __table_args__ = (UniqueConstraint("cluster_id", "action_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    action_id: Mapped[str] = mapped_column(String(128))
    policy: Mapped[str] = mapped_column(String(253))
    target: Mapped[str] = mapped_column(String(800))
    action: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(16))
    result: Mapped[str] = mapped_column(String(32))
    time: Mapped[float] = mapped_column(Float)
    received_at: Mapped[float] = mapped_column(Float)
    gpu_hours_per_month: Mapped[float | None] = mapped_column(Float, nullable=True)  # a proposal's estimate


class ActionBatch(Base):
    """An idempotency key already accepted, with the answer it got (a retry gets the same)."""

    __tablename__ = "action_batches"
    __table_args__ = (UniqueConstraint("cluster_id", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(128))
    accepted: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[float] = mapped_column(Float)


class Summary(Base):
    """One cluster summary report (docs/hub-api.md): its figures as columns (the charts read them), the report
    as sent in `body`. (cluster, report id) is unique: a retried batch is stored once. Bounded per cluster
    (`Hub.summary_retention`, oldest removed first)."""

    __tablename__ = "summaries"
    __table_args__ = (UniqueConstraint("cluster_id", "report_id"),
                      Index("ix_summaries_cluster_time", "cluster_id", "time"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    report_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    received_at: Mapped[float] = mapped_column(Float)
    gpus: Mapped[int] = mapped_column(Integer)
    allocated: Mapped[int] = mapped_column(Integer)
    idle: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pending: Mapped[int] = mapped_column(Integer)
    actions_applied: Mapped[int] = mapped_column(Integer)  # since the report before
    cost_per_hour: Mapped[float] = mapped_column(Float)
    savings_per_hour: Mapped[float] = mapped_column(Float)  # what this report's newly applied actions save
    savings_rate: Mapped[float] = mapped_column(Float)  # all reported so far, per hour: the running total
    saved_total: Mapped[float] = mapped_column(Float)  # money saved up to this report (hub/summaries.py)
    body: Mapped[str] = mapped_column(Text)  # JSON, as sent


class Audit(Base):
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(253))
    cluster: Mapped[str | None] = mapped_column(String(253), nullable=True)
    verb: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text, default="")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets foreign keys on and waits for locks (several gunicorn workers)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest migration; one INFO line says which schema it holds (alembic's own
    lines are its INFO chatter: `kubeon-gpu hub` keeps them below its level)."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        before = MigrationContext.configure(connection).get_current_revision()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        after = MigrationContext.configure(connection).get_current_revision()
    upgraded = f" (upgraded from {before or 'an empty database'})" if before != after else ""
    log.info("database %s: schema %s%s", engine.url.render_as_string(hide_password=True), after, upgraded)


def open_db(url: str, *, upgrade: bool = True) -> sessionmaker[Any]:
    """A session factory for `url`, migrated to head first."""
    engine = make_engine(url)
    if upgrade:
        migrate(engine)
    return sessionmaker(engine, expire_on_commit=False)
