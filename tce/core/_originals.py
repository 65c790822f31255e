"""torch.save and torch.load as torch defines them.

Captured when tce is first imported, before :func:`tce.patch_torch` can
replace them, so TCE's own fallbacks and loads never go through the patch.
"""

import torch

torch_save = torch.serialization.save
torch_load = torch.serialization.load
