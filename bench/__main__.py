"""`python -m bench [--smoke | --quick]`: see bench/README.md."""

from bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
