"""Experiment exp5_ablations: its definition is README.md beside this file."""
