"""Task fine-tuning arms of Speculative Streaming's Table 1: ``train``, ``prune``, ``eval`` and ``table``
(`downstream.cli`). Runs from any directory: ``python path/to/benchmarks/run_downstream.py --help``."""

from downstream.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
