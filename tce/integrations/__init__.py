"""Framework adapters at the edge: the DeepSpeed checkpoint engine and the
torch.save / torch.load patch. They call the public API (:mod:`tce.api`,
:mod:`tce.client`), never another package's private modules.
"""
