"""The platform seam: `native` is posix.py or windows.py, chosen here once
(as psutil picks its `_psplatform`). Both answer the same names; nothing else
in the package asks which system it runs on. docs/architecture.md, "The
platform seam: POSIX and Windows", lists what each holds."""
import os

if os.name == "nt":
    from . import windows as native
else:
    from . import posix as native

__all__ = ["native"]
