"""analyses: stored results of `twoclocks analyze` (options + result JSON per sweep)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "analyses",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON, nullable=False),
    )
    op.create_index("ix_analyses_sweep_created", "analyses", ["sweep_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_analyses_sweep_created", table_name="analyses")
    op.drop_table("analyses")
