"""The core: the evicting cache, attention over it, policies, noise, quantization, generation and model
support. Imports nothing from :mod:`keyformer.run` or :mod:`keyformer.lab`."""
