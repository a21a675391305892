"""`python -m runstream` is the `runstream` command."""

from runstream.cli.main import main

main()
