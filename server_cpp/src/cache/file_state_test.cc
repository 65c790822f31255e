#include "cache/file_state.h"

#include <gtest/gtest.h>

#include <set>

#include "cache/file_state_proto.h"

namespace tce {
namespace {

// Every proto value maps to a C++ state and back; its stored name is the
// proto name without the prefix (what clients print, and what databases of
// every release hold).
TEST(FileState, EveryProtoValueMapsBothWays) {
  const google::protobuf::EnumDescriptor* e = v1::FileState_descriptor();
  int mapped = 0;
  for (int i = 0; i < e->value_count(); ++i) {
    const int number = e->value(i)->number();
    FileState s;
    if (number == v1::FILE_STATE_UNSPECIFIED) {
      EXPECT_FALSE(FileStateFromProto(number, &s));
      continue;
    }
    ASSERT_TRUE(FileStateFromProto(number, &s)) << e->value(i)->name();
    EXPECT_EQ(FileStateToProto(s), number);
    EXPECT_EQ(static_cast<int>(s), number);
    EXPECT_EQ("FILE_STATE_" + std::string(FileStateName(s)), e->value(i)->name());
    ++mapped;
  }
  EXPECT_EQ(mapped, static_cast<int>(std::size(kFileStates)));
  FileState s;
  EXPECT_FALSE(FileStateFromProto(e->value_count() + 1, &s));
}

TEST(FileState, StoredNamesRoundTrip) {
  std::set<std::string> names, labels;
  for (const FileStateRow& row : kFileStates) {
    FileState s;
    ASSERT_TRUE(ParseFileState(row.stored_name, &s)) << row.stored_name;
    EXPECT_EQ(s, row.state);
    EXPECT_STREQ(FileStateName(row.state), row.stored_name);
    EXPECT_STREQ(FileStateLabel(row.state), row.metrics_label);
    names.insert(row.stored_name);
    labels.insert(row.metrics_label);
  }
  EXPECT_EQ(names.size(), std::size(kFileStates));
  EXPECT_EQ(labels.size(), std::size(kFileStates));
  // Names released databases hold, spelled out: they never change.
  EXPECT_EQ(names, (std::set<std::string>{"PENDING", "CACHED", "BACKED_UP", "PERSISTED", "FAILED", "EVICTED",
                                          "DISCARDED"}));
  FileState s;
  for (const char* bad : {"", "persisted", "UNSPECIFIED", "PERSISTED ", "FILE_STATE_CACHED"})
    EXPECT_FALSE(ParseFileState(bad, &s)) << bad;
  EXPECT_STREQ(FileStateName(static_cast<FileState>(0)), "UNSPECIFIED");
}

}  // namespace
}  // namespace tce
