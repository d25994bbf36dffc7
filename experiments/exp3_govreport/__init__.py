"""Experiment exp3_govreport: its definition is README.md beside this file."""
