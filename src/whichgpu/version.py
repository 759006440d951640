"""whichgpu's version, in a leaf module every layer may import (``whichgpu.__version__`` is
the same string): results and reports record it."""

__version__ = "0.1.0"
