import argparse

from kenning.bench.main import add_arguments, run
from kenning.logs import configure_logging

parser = argparse.ArgumentParser(prog="python -m kenning.bench", description="Kenning's benchmark suite.")
add_arguments(parser)
arguments = parser.parse_args()
configure_logging(arguments.log_level, arguments.log_format)
raise SystemExit(run(arguments))
