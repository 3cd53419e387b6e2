"""`python -m codegen.cli ...`: the same as `mi100-codegen ...` (for a machine where the console
script is not on PATH)."""

from codegen.cli import main

main()
