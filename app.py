"""`python app.py`: the gguf-trainer GUI at http://127.0.0.1:8655/ (same as `gguf-trainer`).

`python app.py --demo` also builds the demo project on tiny offline models (once) and starts
it, so the whole pipeline runs in the browser without downloading anything. Options:
`--host/--port/--no-browser/--auto-resume/--share/--auth/--allow-dir` (see `--help`).
"""
from __future__ import annotations

import sys

from ui.launcher import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
