"""Experiment exp6_speedup: its definition is README.md beside this file."""
