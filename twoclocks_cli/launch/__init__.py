"""Launching sweeps: executors (local, slurm, debug), the job side, reconciliation, cancel."""
