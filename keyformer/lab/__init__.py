"""Research tooling: benchmarks, results collection and reports, analysis, attention statistics and the
queue runner. May import from :mod:`keyformer.run` and :mod:`keyformer.core`; nothing imports from here."""
