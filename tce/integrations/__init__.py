"""Framework adapters at the edge: the DeepSpeed checkpoint engine and the
torch.save / torch.load patch. They call the public API and the internal
service API (:mod:`tce._service`), never other modules' private helpers.
"""
