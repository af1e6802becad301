#!/usr/bin/env python
"""Build (or find in the cache) dsparkhub's embedded example and print where it is, its build time and τ.

Same as ``dsparkhub example build``; kept as a script for CI warm-up steps:

    python scripts/build_example.py [--cache-dir DIR] [--force]
"""

import sys

from dsparkhub.example import main

if __name__ == "__main__":
    sys.exit(main())
