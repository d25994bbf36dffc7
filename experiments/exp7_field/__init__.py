"""Experiment exp7_field: its definition is README.md beside this file."""
