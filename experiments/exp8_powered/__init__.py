"""Experiment exp8_powered: its definition is README.md beside this file."""
