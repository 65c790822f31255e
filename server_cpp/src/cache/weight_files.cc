#include "cache/weight_files.h"

#include <algorithm>

namespace tce {

bool IsWeightFile(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  for (const char* word : {"optim", "scheduler", "rng", "trainer_state", "training_args"})
    if (name.find(word) != std::string::npos) return false;
  return true;
}

TagInfo WeightFilesOf(TagInfo tag) {
  tag.files.erase(std::remove_if(tag.files.begin(), tag.files.end(),
                                 [](const TagFile& f) { return !IsWeightFile(f.path); }),
                  tag.files.end());
  return tag;
}

}  // namespace tce
