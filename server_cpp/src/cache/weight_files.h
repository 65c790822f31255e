// Which files of a published version a following node is given: its weight
// files, never the optimizer's state (docs/weights.md#other-nodes).
//
// A version's weight files are every file of its tag whose name (the last
// path component) does not say it holds optimizer, scheduler or RNG state
// or a trainer's bookkeeping: no "optim", "scheduler", "rng",
// "trainer_state" or "training_args" in it. So DeepSpeed's
// `*_optim_states.pt`, Hugging Face's `optimizer.pt`, `scheduler.pt` and
// `rng_state.pth` stay on the trainer's nodes; model files, safetensors,
// DCP's `.metadata` and `*.distcp` are given. The same names
// tce.weights.weight_files leaves out of torch.save checkpoints
// (tce/_weight_formats.py). A file that holds both (a Lightning `.ckpt`, a
// DCP data file of a state dict that has the optimizer's) is given whole:
// save the optimizer's state in files of its own to keep it at home.
// Pure functions; any thread.
#pragma once

#include <string>

#include "cache/cache_types.h"

namespace tce {

bool IsWeightFile(const std::string& path);

// `tag` with its weight files only.
TagInfo WeightFilesOf(TagInfo tag);

}  // namespace tce
