import argparse

from kenning.observability.logs import configure_logging
from kenning_devtools.bench.main import add_arguments, run

parser = argparse.ArgumentParser(prog="python -m kenning_devtools.bench", description="Kenning's benchmark suite.")
add_arguments(parser)
arguments = parser.parse_args()
configure_logging(arguments.log_level, arguments.log_format)
raise SystemExit(run(arguments))
