"""Alembic environment: run against the connection `hub.db.migrate` hands over (or the URL in the config)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from hub.db import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "sqlite:///hub.db")
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
