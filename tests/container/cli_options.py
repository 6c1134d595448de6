"""zstd-style options of tzip (doc/cli.md "Options"): cases for cli_test.py."""
import cli_test as T  # noqa: F401
