"""Put on PYTHONPATH by the browser test: every Python process the app starts imports this.

In the evaluate stage's process only, and only while GGUF_TEST_EVAL_HOLD names a FIFO, the stage's first
read of the GGUF waits until the test has opened that FIFO for writing and closed it again. The stage is
then inside its work (its stop handlers installed) for as long as the test needs, whatever the speed of
the evaluation itself (a demo's takes a fraction of a second).
"""
import os

_FIFO = os.environ.get("GGUF_TEST_EVAL_HOLD")


def _is_eval_stage() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"trainer_core.stages.evaluate" in f.read().split(b"\0")
    except OSError:
        return False


if _FIFO and _is_eval_stage():
    import trainer_core.contract.gguf_io as _gguf_io

    _read = _gguf_io.read_adapter_gguf

    def _held_read(*args, **kwargs):
        with open(_FIFO, "rb") as f:     # blocks until the test opens the write end; returns at its close
            f.read()
        return _read(*args, **kwargs)

    _gguf_io.read_adapter_gguf = _held_read
