"""Experiment fewshot: its definition is README.md beside this file."""
