"""corral: a GPU cluster scheduler for deep-learning jobs.

The same scheduling policies run in a fast trace-driven simulator (`corral.sim`) and, later, in a live
controller. Layers import inward only::

    core <- policies <- engine <- sim
                               <- live (future)

See ``DESIGN.md``-level notes in ``docs/architecture.md``.
"""

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

__version__ = "0.1.0"


def compiled() -> bool:
    """Whether this install runs the compiled core (``CORRAL_COMPILE=1 pip install .``; see ``setup.py``): its event
    loop is an extension module rather than Python source. Found by looking for the file, without importing it."""
    engine = Path(__file__).parent / "engine"
    return any((engine / f"loop{suffix}").exists() for suffix in EXTENSION_SUFFIXES)
