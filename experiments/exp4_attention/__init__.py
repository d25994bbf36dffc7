"""Experiment exp4_attention: its definition is README.md beside this file."""
