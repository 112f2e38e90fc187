"""dflash-ref: the reference implementation of DFlash speculative decoding.

The NumPy code under :mod:`dflash_ref` is the specification; :mod:`kernels_cupy` holds a CuPy
RawKernel twin of every op with the same name, signature and meaning. Components receive a
:class:`~dflash_ref.backend.Backend` and run on either.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dflash-ref")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

from dflash_ref.backend import Backend, get_backend  # noqa: E402
from dflash_ref.diagnose import explain  # noqa: E402
from dflash_ref.errors import (  # noqa: E402
    BackendUnavailable,
    ConfigError,
    DFlashRefError,
    FormatError,
    PagerError,
)
from dflash_ref.io.tokenizer import Tokenizer, load_tokenizer  # noqa: E402
from dflash_ref.models.drafter import DFlashDrafter  # noqa: E402
from dflash_ref.models.target import TargetModel  # noqa: E402
from dflash_ref.spec_decode.batch import generate_batch  # noqa: E402
from dflash_ref.spec_decode.loop import GenerationResult, generate  # noqa: E402

__all__ = [
    "Backend",
    "BackendUnavailable",
    "ConfigError",
    "DFlashDrafter",
    "DFlashRefError",
    "FormatError",
    "GenerationResult",
    "PagerError",
    "TargetModel",
    "Tokenizer",
    "__version__",
    "explain",
    "generate",
    "generate_batch",
    "get_backend",
    "load_tokenizer",
]
