// TagFeed: how the Cache tells what follows its tags that a job recorded a
// complete tag (persist/storage_retention.h keeps the queue of such jobs and
// applies `storage_keep_last` to them on its own thread).
//
// Called with the Cache's lock held: an implementation only queues, takes
// only its own lock and never calls back into the Cache. Any thread.
#pragma once

#include <string>

namespace tce {

class TagFeed {
 public:
  virtual ~TagFeed() = default;
  // `job` recorded a complete tag (CommitTag).
  virtual void TagComplete(const std::string& job) = 0;
};

}  // namespace tce
