#include "cache/tag_proto.h"

#include "common/validate.h"

namespace tce {

Status CheckTag(const v1::TagInfo& t, const std::string& field) {
  Status s = ValidateName(field + ".job", t.job(), /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) s = ValidateName(field + ".tag", t.tag(), /*allow_empty=*/true, /*allow_slash=*/false);
  if (s.ok() && static_cast<size_t>(t.files_size()) > kMaxFilesPerTag)
    s = Status::InvalidArgument(field + ".files: " + std::to_string(t.files_size()) + " entries, more than " +
                                std::to_string(kMaxFilesPerTag));
  if (s.ok() && (t.world_size() < 1 || t.world_size() > kMaxWorldSize))
    s = Status::InvalidArgument(field + ".world_size: must be in [1, " + std::to_string(kMaxWorldSize) +
                                "], got " + std::to_string(t.world_size()));
  for (int i = 0; s.ok() && i < t.files_size(); ++i) {
    const std::string f = field + ".files[" + std::to_string(i) + "]";
    s = ValidatePath(t.files(i).path(), f + ".path");
    if (s.ok()) s = ValidateRank(f + ".rank", t.files(i).rank());
  }
  return s;
}

}  // namespace tce
