"""`python -m benchmarks`: see benchmarks/run.py and README.md."""

from benchmarks.run import main

main()
