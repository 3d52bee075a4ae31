"""SPIRe's projected throughput multiplier over batch size x context length (`roofline.cli`): a table per method,
a Fig. 4-style heatmap, JSON. Runs from any directory: ``python path/to/benchmarks/run_roofline.py --help``."""

from roofline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
