"""`python -m trainer_core` is `gguf-trainer`."""
import sys

from .cli import main

sys.exit(main())
