"""`python -m asyncppo` runs the command line."""

from asyncppo.cli.main import run_as_program

run_as_program()
