"""The first schema: clusters, tokens, policies, approvals, actions, action batches, audit.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(253), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_poll_at", sa.Float, nullable=True),
        sa.Column("last_poll_result", sa.String(32), nullable=True),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("hint", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("first_used_at", sa.Float, nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
    )
    op.create_table(
        "policies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("cluster_id", "name"),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("policy", sa.String(253), nullable=False),
        sa.Column("target", sa.String(800), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("withdrawn", sa.Boolean, nullable=False),
    )
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("action_id", sa.String(128), nullable=False),
        sa.Column("policy", sa.String(253), nullable=False),
        sa.Column("target", sa.String(800), nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("result", sa.String(32), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.UniqueConstraint("cluster_id", "action_id"),
    )
    op.create_table(
        "action_batches",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("accepted", sa.Integer, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.UniqueConstraint("cluster_id", "key"),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("cluster", sa.String(253), nullable=True),
        sa.Column("verb", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("audit", "action_batches", "actions", "approvals", "policies", "tokens", "clusters"):
        op.drop_table(table)
