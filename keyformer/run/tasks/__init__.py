"""Task plug-ins of the job scaffold (:mod:`keyformer.run.scaffold`): ``generate`` and ``lm_eval``."""
