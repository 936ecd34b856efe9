#!/usr/bin/env python3
# softrdma's runner of rdma-core's pyverbs tests (test/pyverbs): the
# suite's run_tests.py, copied beside it, with two changes. The verbose
# lines name each test by its id ("test_x (tests.test_m.Class.test_x) ... ok")
# instead of the first line of its docstring, and they go to the file given
# by --results FILE, not to stderr, where the libraries' own messages would
# interleave with them.
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
argv = sys.argv[1:]
if len(argv) < 2 or argv[0] != '--results':
    sys.exit('usage: softrdma_run.py --results FILE [run_tests.py arguments]')
results = argv[1]
sys.argv[1:] = argv[2:]

from args_parser import parser  # noqa: E402

tests = SourceFileLoader('tests', os.path.join(here, '__init__.py')).load_module()
parser.parse_args()
with open(results, 'w', buffering=1) as f:
    runner = unittest.TextTestRunner(stream=f, verbosity=2, descriptions=False)
    unittest.main(module=tests, testRunner=runner)
