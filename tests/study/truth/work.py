"""CPU work of a known length, for the truth table's models and its busy client."""

import time


def spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time: under contention for the cores, or for
    Python's GIL, it takes longer by the clock."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
