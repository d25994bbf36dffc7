"""Experiment gpu_studies: its definition is README.md beside this file."""
