"""Experiment exp1_cnndm: its definition is README.md beside this file."""
