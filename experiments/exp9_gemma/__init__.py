"""Experiment exp9_gemma: its definition is README.md beside this file."""
