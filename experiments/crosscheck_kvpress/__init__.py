"""Experiment crosscheck_kvpress: its definition is README.md beside this file."""
