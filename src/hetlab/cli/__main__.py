"""`python -m hetlab.cli`: the `hetlab` command."""

from hetlab.cli import main

main()
