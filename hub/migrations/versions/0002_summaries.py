"""Cluster summary reports (issue 46) and a proposal's estimated GPU-hours per month on actions.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "summaries",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("report_id", sa.String(128), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("allocated", sa.Integer, nullable=False),
        sa.Column("idle", sa.Integer, nullable=True),
        sa.Column("pending", sa.Integer, nullable=False),
        sa.Column("actions_applied", sa.Integer, nullable=False),
        sa.Column("cost_per_hour", sa.Float, nullable=False),
        sa.Column("savings_per_hour", sa.Float, nullable=False),
        sa.Column("savings_rate", sa.Float, nullable=False),
        sa.Column("saved_total", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.UniqueConstraint("cluster_id", "report_id"),
    )
    op.create_index("ix_summaries_cluster_time", "summaries", ["cluster_id", "time"])  # the charts' time range
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("gpu_hours_per_month", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("gpu_hours_per_month")
    op.drop_table("summaries")
