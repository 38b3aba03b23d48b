"""The command-line tools: argparse only, one module per command, each a thin layer over a library function."""
