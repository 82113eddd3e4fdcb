"""``kenning healthcheck``: the container healthcheck, for every process.

``--url`` asks an HTTP endpoint (the ingress's ``/healthz``); ``--file`` checks that a
process's ``--health-file`` was touched within ``--max-age`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx

from kenning.hosting.config import positive_float

HELP = "container healthcheck: an HTTP URL or a health file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="healthy if GET answers 2xx")
    target.add_argument("--file", help="healthy if touched within --max-age seconds")
    parser.add_argument("--max-age", type=positive_float, default=30.0, help="seconds (default 30)")


def run(args: argparse.Namespace) -> int:
    if args.url:
        try:
            response = httpx.get(args.url, timeout=5)
        except httpx.HTTPError as error:
            sys.stderr.write(f"unhealthy: {args.url}: {error}\n")
            return 1
        if not response.is_success:
            sys.stderr.write(f"unhealthy: {args.url} answered {response.status_code}\n")
            return 1
        return 0
    try:
        age = time.time() - os.stat(args.file).st_mtime
    except FileNotFoundError:
        sys.stderr.write(f"unhealthy: {args.file} does not exist\n")
        return 1
    if age > args.max_age:
        sys.stderr.write(f"unhealthy: {args.file} last touched {age:.0f} s ago\n")
        return 1
    return 0
