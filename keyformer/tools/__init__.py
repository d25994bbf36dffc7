"""Results tools, each an installed entry point: collect run folders, print the report tables, exp4 stats."""
