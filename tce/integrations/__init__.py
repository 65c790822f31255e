"""Framework adapters at the edge: the DeepSpeed checkpoint engine and the
torch.save / torch.load patch.
"""
