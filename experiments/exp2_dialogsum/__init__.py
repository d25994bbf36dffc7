"""Experiment exp2_dialogsum: its definition is README.md beside this file."""
