"""An example kvrank model plugin: a SASRec-style causal transformer with its own features.

Installed next to kvrank (``pip install ./examples/sasrec``), it registers the architecture
``sasrec`` in the ``kvrank.models`` entry-point group; its config chooses positions from the
oldest event (extendable) or from the newest (not extendable).
"""

from kvrank_sasrec.model import ARCHITECTURE, SASRecConfig, build

__all__ = ["ARCHITECTURE", "SASRecConfig", "build"]
__version__ = "0.1.0"
