"""`python -m trainer_core` is `gguf-trainer`."""
import sys

from trainer_core.cli import main

sys.exit(main())
