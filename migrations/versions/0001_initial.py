"""initial store: sweeps, runs, metrics, run_events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("executor", sa.String(32)),
        sa.Column("folder", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE")),
        sa.Column("cell_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("batch_prompts", sa.Integer),
        sa.Column("group_size", sa.Integer),
        sa.Column("batch_samples", sa.Integer),
        sa.Column("lr", sa.Float),
        sa.Column("clip_low", sa.Float),
        sa.Column("clip_high", sa.Float),
        sa.Column("seed", sa.Integer),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(64)),
        sa.Column("host", sa.String(255)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True)),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("sweep_id", "cell_id", name="uq_runs_sweep_cell"),
    )
    op.create_index("ix_runs_sweep_status", "runs", ["sweep_id", "status"])
    op.create_table(
        "metrics",
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("samples", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Float),
    )
    op.create_index("ix_metrics_key_run_samples", "metrics", ["key", "run_id", "samples"])
    op.create_table(
        "run_events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("message", sa.Text),
    )
    op.create_index("ix_run_events_run", "run_events", ["run_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_run_events_run", table_name="run_events")
    op.drop_table("run_events")
    op.drop_index("ix_metrics_key_run_samples", table_name="metrics")
    op.drop_table("metrics")
    op.drop_index("ix_runs_sweep_status", table_name="runs")
    op.drop_table("runs")
    op.drop_table("sweeps")
