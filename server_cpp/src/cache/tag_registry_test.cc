#include "cache/tag_registry.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

TagInfo Tag(const std::string& job, const std::string& name, std::vector<TagFile> files,
            int32_t world_size = 2) {
  TagInfo t;
  t.job = job;
  t.tag = name;
  t.world_size = world_size;
  t.files = std::move(files);
  return t;
}

TEST(TagRegistry, CheckSortsAndNamesTheFirstProblem) {
  TagInfo t = Tag("j", "s", {{1, "/c/z", 5}, {0, "/c/b", 3}, {0, "/c/a", 4}});
  EXPECT_EQ(TagRegistry::Check(&t), "");
  ASSERT_EQ(t.files.size(), 3u);
  EXPECT_EQ(t.files[0].path, "/c/a");
  EXPECT_EQ(t.files[2].path, "/c/z");

  TagInfo no_job = Tag("", "s", {{0, "/c/a", 1}});
  EXPECT_EQ(TagRegistry::Check(&no_job), "a tag needs a job");
  TagInfo relative = Tag("j", "s", {{0, "c/a", 1}});
  EXPECT_EQ(TagRegistry::Check(&relative), "tag file path must be absolute: 'c/a'");
  TagInfo outside = Tag("j", "s", {{2, "/c/a", 1}});
  EXPECT_EQ(TagRegistry::Check(&outside), "rank 2 of /c/a is outside world_size 2");
  TagInfo twice = Tag("j", "s", {{0, "/c/a", 1}, {1, "/c/a", 1}});
  EXPECT_EQ(TagRegistry::Check(&twice), "file listed twice in tag s: /c/a");
  TagInfo empty = Tag("j", "s", {});
  EXPECT_EQ(TagRegistry::Check(&empty), "tag s lists no files");
}

TEST(TagRegistry, ListsAJobsTagsOldestFirstAndReplacesARecordedTag) {
  TagRegistry r;
  r.Complete(Tag("j", "step10", {{0, "/c/10", 1}}), 300);
  r.Complete(Tag("j", "step9", {{0, "/c/9", 1}}), 200);
  r.Complete(Tag("j2", "step1", {{0, "/d/1", 1}}), 100);
  r.Complete(Tag("j", "step9", {{0, "/c/9", 1}, {1, "/c/9b", 1}}), 400);  // again: replaces
  std::vector<TagInfo> tags = r.List("j");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step10");
  EXPECT_EQ(tags[1].tag, "step9");
  EXPECT_EQ(tags[1].complete_unix_ns, 400);
  EXPECT_EQ(tags[1].files.size(), 2u);
  EXPECT_EQ(r.List("j2").size(), 1u);
  EXPECT_TRUE(r.List("j3").empty());
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(r.All().size(), 3u);
  EXPECT_EQ(r.Restore({Tag("j3", "a", {{0, "/e/a", 1}})}), 4u);
}

TEST(TagRegistry, AdoptsATagFromTheRingUnlessOneAsNewIsRecorded) {
  TagRegistry r;
  TagInfo ring = Tag("j", "step2", {{0, "/c/2", 1}});
  ring.complete_unix_ns = 500;
  EXPECT_TRUE(r.Adopt(ring));  // its completion time is kept, not "now"
  TagInfo found;
  ASSERT_TRUE(r.Find("j", "step2", &found));
  EXPECT_EQ(found.complete_unix_ns, 500);
  EXPECT_FALSE(r.Adopt(ring));  // the same again
  TagInfo older = ring;
  older.complete_unix_ns = 400;
  older.files.push_back({1, "/c/2b", 1});
  EXPECT_FALSE(r.Adopt(older));
  ASSERT_TRUE(r.Find("j", "step2", &found));
  EXPECT_EQ(found.files.size(), 1u);
  r.Complete(Tag("j", "step2", {{0, "/c/2", 1}, {1, "/c/2c", 1}}), 900);  // re-recorded here
  EXPECT_FALSE(r.Adopt(ring));
  ASSERT_TRUE(r.Find("j", "step2", &found));
  EXPECT_EQ(found.complete_unix_ns, 900);
  EXPECT_FALSE(r.Find("j", "step3", &found));
  EXPECT_FALSE(r.Find("other", "step2", &found));
}

}  // namespace
}  // namespace tce
