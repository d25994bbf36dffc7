"""The job scaffold: config validation, the results contract, data, metrics, model loading, W&B and the
tasks (``generate``, ``lm_eval``). Imports from :mod:`keyformer.core`, never from :mod:`keyformer.lab`.
Importing this package loads nothing heavy."""

from keyformer.run.resolvers import register as _register_resolvers

_register_resolvers()
