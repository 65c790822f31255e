"""Framework adapters at the edge: the DeepSpeed checkpoint engine and the
torch.save / torch.load patch. They call the public API (:mod:`tce.api`,
:mod:`tce.client`, :mod:`tce.buffers`, :mod:`tce.objects`) and
:mod:`tce.core.dist` (rank, world size, the ring), never another package's
private modules; the package itself (:mod:`tce`) takes what it re-exports
from here.
"""

from tce.integrations._deepspeed import engine_class
from tce.integrations._deepspeed_hook import attach, install_deepspeed
from tce.integrations._patch import patch_torch, unpatch_torch

__all__ = ["attach", "engine_class", "install_deepspeed", "patch_torch", "unpatch_torch"]
