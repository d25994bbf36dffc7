"""Experiment exp10_ruler: its definition is README.md beside this file."""
