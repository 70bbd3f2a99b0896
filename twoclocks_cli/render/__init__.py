"""Rendering stored results for people: tables, plots and the self-contained HTML report."""
