"""``python -m tests.peer`` (``make test-peer``): run PyTorch's own tests against commscope.

    python -m tests.peer                      # the CI selection of every suite (~30 s)
    python -m tests.peer --mode all           # whole files, torch's own harness (40+ min)
    python -m tests.peer --against both       # torch's own classes too: the baseline
    python -m tests.peer --suite device_mesh -k "InitDeviceMeshTest"

Exits 1 when a test fails against commscope; a suite whose file is absent (or that this
torch cannot import) is reported and does not fail the run.
"""

from __future__ import annotations

import argparse
import sys

from tests.peer.runner import MODES, run_suite
from tests.peer.suites import SUITES


def main(argv: list[str] | None = None) -> int:
    """Run the chosen suites, print one line per child run and every failure."""
    parser = argparse.ArgumentParser(prog="python -m tests.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", choices=sorted(SUITES),
                        help="run this suite (repeatable; default: all)")
    parser.add_argument("--mode", choices=MODES, default="ci",
                        help="ci: whole file with forked ranks plus a spawn sample; fork: "
                        "without the sample; all: torch's own harness (slow)")
    parser.add_argument("--against", choices=("commscope", "torch", "both"),
                        default="commscope", help="whose classes the file tests")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression for every run")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds for each child run as a whole (default 3600)")
    args = parser.parse_args(argv)
    targets = ["torch", "commscope"] if args.against == "both" else [args.against]
    failed = False
    lines = []
    for name in args.suite or sorted(SUITES):
        suite = SUITES[name]
        for against in targets:
            for outcome in run_suite(suite, against=against, mode=args.mode,
                                     keyword=args.keyword, timeout=args.timeout):
                lines.append(outcome.line())
                print(lines[-1], flush=True)
                for node in outcome.failed:
                    print(f"    FAILED {node}")
                if outcome.timed_out or (outcome.not_run is None and not outcome.ok):
                    print(outcome.output[-4000:])
                failed |= against == "commscope" and outcome.not_run is None and not outcome.ok
        for node, why in suite.out_of_scope.items():
            print(f"    not run against commscope: {node}: {why}")
    print("\n" + "\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
