"""The ``hf-speculative`` command implementations, one module per command.

Every module here has ``add_parser(subparsers)``, which registers its command and sets ``func=run``, and
``run(args) -> int``. Modules import only the standard library (and `.common`) at module level, so that
``hf-speculative --help`` stays fast; torch, transformers and the drafters are imported inside ``run``.
Imports flow one way: ``cli`` -> ``commands`` -> drafters / training / bench -> the engine.
"""
