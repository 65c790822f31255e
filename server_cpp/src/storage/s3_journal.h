// UploadJournal: the multipart uploads an S3Store began and has not ended,
// in a file of its own under state_dir, so that a restart after a crash
// aborts what the crashed run left, and only that (never another writer's
// uploads in a shared bucket). One line per event:
//
//   ? TOKEN T SLACK KEY   a CreateMultipartUpload of KEY is about to be sent
//                         (synced first): T is the store's time then, in
//                         seconds since the epoch, good to SLACK seconds
//   = TOKEN               its answer came (written with the + line)
//   + ID KEY              upload ID of KEY exists (synced before its first part)
//   - ID                  upload ID was completed or aborted
//
// A `?` with no `=` is a creation whose answer the run never saw: its
// upload exists, unnamed; the restart finds it by its key and the time S3
// says it was initiated. Lines are written whole under a lock, so a reader
// never sees a torn one. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace tce {

class UploadJournal {
 public:
  // `path` empty: nothing is journaled (and nothing is left).
  explicit UploadJournal(std::string path) : path_(std::move(path)) {}

  // Before a CreateMultipartUpload of `key` (the store's time `at_s`, good
  // to `slack_s`): returns the token that names it.
  std::string Creating(const std::string& key, int64_t at_s, int64_t slack_s) EXCLUDES(mu_);
  // Its answer: upload `id`. (Ids this run created are never a crashed
  // run's: CreatedHere.)
  void Created(const std::string& token, const std::string& id, const std::string& key) EXCLUDES(mu_);
  void Ended(const std::string& id) EXCLUDES(mu_);
  bool CreatedHere(const std::string& id) EXCLUDES(mu_);

  struct Creation {
    std::string token, key;
    int64_t at_s = 0, slack_s = 0;
  };
  // What the journal holds open: uploads created and not ended (id ->
  // key), and creations with no answer. `read_bytes`: how much was read.
  struct Open {
    std::map<std::string, std::string> uploads;
    std::vector<Creation> creations;
    size_t read_bytes = 0;
  };
  // False when there is no journal (or it is larger than 16 MiB: then it
  // is started anew by Rewrite).
  bool Read(Open* out) EXCLUDES(mu_);
  // Replaces what `read` covered with `keep` (lines, each ending in '\n'),
  // keeping whatever was journaled since it was read.
  void Rewrite(const Open& read, const std::string& keep) EXCLUDES(mu_);
  // 16 random hex digits (a creation's token; also what else needs one).
  static std::string NewToken();
  // The lines that keep an upload or a creation open until the next start.
  static std::string UploadLine(const std::string& id, const std::string& key);
  static std::string CreationLine(const Creation& c);

 private:
  // Appends `text` (whole lines); synced when `sync`.
  void Append(const std::string& text, bool sync) REQUIRES(mu_);

  const std::string path_;
  Mutex mu_;  // one writer at a time; a rewrite excludes appends
  std::set<std::string> created_ GUARDED_BY(mu_);  // upload ids this run created
};

}  // namespace tce
