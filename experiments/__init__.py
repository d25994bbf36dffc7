"""The lab's studies: one folder per experiment, holding its definition (README.md), its findings and its
own code. Run a study's script from the checkout's root as a module:
``python -m experiments.<study>.<script>``.
Nothing here is installed with ``keyformer``.
"""
