"""`python app.py`: the gguf-trainer GUI.

The browser GUI arrives with a later version; until then this entry point says so, and
`python app.py --demo` builds the demo project on tiny offline models and runs it through
every stage this version has.
"""
from __future__ import annotations

import sys

from trainer_core.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
