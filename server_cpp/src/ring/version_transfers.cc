// VersionFollower: the files of followed versions (ring/version_follower.h):
// bringing a version's files here from the sources, a transfer served on to
// following nodes as its ranges land, and the transfers started for them
// (pull through).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/logging.h"
#include "persist/crc.h"
#include "ring/range_read.h"
#include "ring/version_follower.h"

namespace tce {

Status VersionFollower::Fetch(const TagInfo& tag, const std::vector<std::string>& paths,
                              Clock::TimePoint deadline) {
  std::vector<std::string> sources;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(tag.job);
    if (it == jobs_.end()) return Status::OK();  // not followed: its files are this node's own
    sources = it->second.sources;
  }
  for (const std::string& path : paths) {
    auto file = std::find_if(tag.files.begin(), tag.files.end(), [&](const TagFile& f) { return f.path == path; });
    if (file == tag.files.end())
      return Status::InvalidArgument(path + " is not a file of version " + std::to_string(tag.version) +
                                     " of job '" + tag.job + "'");
    const std::pair<std::string, std::string> key{tag.job, path};
    {
      MutexLock lock(&mu_);
      while (fetching_.count(key) && !stopping_) changed_.Wait(&mu_);  // another reader brings it
      if (stopping_) return Status::Unavailable("the server is shutting down");
      if (cache_->HoldsInMemory(tag.job, path, tag.tag)) continue;
      fetching_.insert(key);
    }
    Status s = FetchFile(tag, *file, sources, deadline);
    {
      MutexLock lock(&mu_);
      fetching_.erase(key);
      changed_.SignalAll();
    }
    if (!s.ok()) return s;
  }
  return Status::OK();
}

uint64_t VersionFollower::Bring(const TagInfo& tag, const TagFile& file, const std::vector<std::string>& sources,
                                size_t first, unsigned char* to, Clock::TimePoint deadline, uint32_t* crc,
                                std::string* from, std::string* why) {
  const std::pair<std::string, std::string> key{tag.job, file.path};
  uint64_t done = 0;
  *crc = 0;
  from->clear();
  for (size_t i = first; i < sources.size() && done < file.size; ++i) {
    const std::string& source = sources[i];
    while (done < file.size) {
      if (options_.clock->Now() >= deadline) {
        *why += "; the call's deadline passed";
        break;
      }
      const uint64_t n = std::min<uint64_t>(kMaxRangeLength, file.size - done);
      uint64_t size = 0;
      Status s = ranges_->ReadVersionFile(source, tag.job, tag.tag, file.path, done, n, to + done, &size, deadline);
      if (s.ok() && size != file.size)
        s = Status::DataLoss(source + " holds " + std::to_string(size) + " bytes of " + file.path +
                             ", the version " + std::to_string(file.size));
      if (!s.ok()) {
        *why += (why->empty() ? "" : "; ") + s.message();
        if (i + 1 < sources.size())
          TCE_LOG(kWarning, "weights") << "bringing " << file.path << " of job=" << tag.job << " from " << source
                                       << " stopped at byte " << done << " of " << file.size << " ("
                                       << s.message() << "): the rest from " << sources[i + 1];
        break;  // the next source gives the rest
      }
      if (from->find(source) == std::string::npos) *from += (from->empty() ? "" : ", ") + source;
      *crc = Crc32(*crc, to + done, n);  // the bytes as they are here
      done += n;
      MutexLock lock(&mu_);
      transfers_[key].landed = done;
      changed_.SignalAll();
    }
  }
  return done;
}

Status VersionFollower::FetchFile(const TagInfo& tag, const TagFile& file, const std::vector<std::string>& sources,
                                  Clock::TimePoint deadline) {
  if (!file.has_crc32)
    return Status::FailedPrecondition(file.path + " of version " + std::to_string(tag.version) + " of job '" +
                                      tag.job + "' has no digest from the node that published it (it did not "
                                      "hold the file in memory): it is not brought here");
  std::unique_ptr<Buffer> mem;
  Status s = cache_->ReserveReplica(tag.job, file.size, &mem);
  if (!s.ok()) return s;
  void* map = mmap(nullptr, mem->capacity(), PROT_READ | PROT_WRITE, MAP_SHARED, mem->fd(), 0);
  if (map == MAP_FAILED) {
    cache_->AbandonRecovery(std::move(mem));
    return Status::Internal("mmap of a new buffer failed");
  }
  auto* to = static_cast<unsigned char*>(map);
  const std::pair<std::string, std::string> key{tag.job, file.path};
  {
    MutexLock lock(&mu_);
    Transfer& t = transfers_[key];  // downstream nodes read what has landed
    t = Transfer();
    t.fd = ::dup(mem->fd());
    t.size = file.size;
  }
  // The whole file from the first source on; bytes that are not those the
  // publisher digested (a source that changed them, CRCs and all) are
  // brought again from the next source on.
  bool good = false;
  std::string why;
  for (size_t first = 0; first < sources.size() && !good; ++first) {
    uint32_t crc = 0;
    std::string from;
    if (Bring(tag, file, sources, first, to, deadline, &crc, &from, &why) < file.size) break;  // each was asked
    good = crc == file.crc32;
    if (good) break;
    const std::string bad = "the bytes of " + file.path + " from " + from + " are not those the node that "
                            "published version " + std::to_string(tag.version) + " digested (CRC-32 " +
                            std::to_string(crc) + ", not " + std::to_string(file.crc32) + ")";
    TCE_LOG(kWarning, "weights") << "job=" << tag.job << ": " << bad
                                 << (first + 1 < sources.size() ? ": brought again from " + sources[first + 1]
                                                                 : std::string());
    why += (why.empty() ? "" : "; ") + bad;
    MutexLock lock(&mu_);
    transfers_[key].landed = 0;
  }
  munmap(map, mem->capacity());
  {
    // No downstream read may be under way when the buffer is handed to the
    // cache (or dropped, its pages punched out): none starts once ended.
    MutexLock lock(&mu_);
    Transfer& t = transfers_[key];
    t.ended = true;
    changed_.SignalAll();
    while (t.readers > 0) changed_.Wait(&mu_);
    ::close(t.fd);
    transfers_.erase(key);
  }
  if (!good) {
    cache_->AbandonRecovery(std::move(mem));
    return Status::Unavailable("no source gave " + file.path + " of version " + std::to_string(tag.version) +
                               " of job '" + tag.job + "': " + why);
  }
  FileInfo f;
  f.job = tag.job;
  f.path = file.path;
  f.size = file.size;
  return cache_->AdoptReplica(std::move(f), tag.version, std::move(mem));
}

Status VersionFollower::StartPull(const std::string& job, const std::string& tag, const std::string& path) {
  const std::pair<std::string, std::string> key{job, path};
  if (stopping_ || !jobs_.count(job)) return Status::NotFound(path + " is not held here");
  TagInfo t;
  // The version may reach this node a moment after it reached the asker
  // (both learn it from the source at once): wait a little for it.
  const Clock::TimePoint learn_by = options_.clock->Now() + kLearnWait;
  while (!cache_->VersionTag(job, tag, &t)) {
    if (stopping_ || options_.clock->Now() >= learn_by)
      return Status::NotFound("no version " + tag + " of job '" + job + "' here");
    options_.clock->WaitUntil(&changed_, &mu_, learn_by);
  }
  if (transfers_.count(key) || fetching_.count(key)) return Status::OK();  // started meanwhile
  auto file = std::find_if(t.files.begin(), t.files.end(), [&](const TagFile& f) { return f.path == path; });
  if (file == t.files.end()) return Status::NotFound(path + " is not a file of " + tag);
  if (cache_->HoldsInMemory(job, path, tag)) return Status::NotFound(path + " was just brought here: ask again");
  for (uint64_t id : pulls_done_) {
    auto done = pulls_.find(id);
    if (done == pulls_.end()) continue;
    done->second.join();
    pulls_.erase(done);
  }
  pulls_done_.clear();
  fetching_.insert(key);
  const uint64_t id = next_pull_++;
  pulls_[id] = std::thread(&VersionFollower::PullThrough, this, id, t, *file);
  return Status::OK();
}

Status VersionFollower::OpenRange(const std::string& job, const std::string& tag, const std::string& path,
                                  uint64_t offset, uint64_t length, int* fd, uint64_t* size) {
  const std::pair<std::string, std::string> key{job, path};
  MutexLock lock(&mu_);
  if (!transfers_.count(key) && !fetching_.count(key)) {  // pull through: start the transfer here
    Status s = StartPull(job, tag, path);
    if (!s.ok()) return s;
  }
  const Clock::TimePoint deadline = options_.clock->Now() + options_.io_timeout;
  for (;;) {
    if (stopping_) return Status::Unavailable("the server is shutting down");
    auto it = transfers_.find(key);
    if (it != transfers_.end()) {
      Transfer& t = it->second;
      if (!t.ended && t.landed >= offset + length && offset + length <= t.size) {
        *fd = ::dup(t.fd);
        if (*fd < 0) return Status::Internal("dup of a transfer's buffer failed");
        ++t.readers;
        *size = t.size;
        return Status::OK();
      }
      if (t.ended) return Status::NotFound("the transfer of " + path + " here ended: ask again");
      if (offset + length > t.size)
        return Status::FromCode(Status::Code::kOutOfRange, "the range ends past " + path + "'s bytes");
    } else if (!fetching_.count(key)) {
      return Status::NotFound(path + " is not in transfer here: ask again");
    }
    if (options_.clock->Now() >= deadline)
      return Status::Unavailable("the range of " + path + " did not land here in time");
    options_.clock->WaitUntil(&changed_, &mu_, deadline);
  }
}

void VersionFollower::CloseRange(const std::string& job, const std::string& path) {
  MutexLock lock(&mu_);
  auto it = transfers_.find({job, path});
  if (it != transfers_.end() && it->second.readers > 0) --it->second.readers;
  changed_.SignalAll();
}

void VersionFollower::PullThrough(uint64_t id, TagInfo tag, TagFile file) {
  std::vector<std::string> sources;
  {
    MutexLock lock(&mu_);
    sources = jobs_[tag.job].sources;
  }
  Status s = FetchFile(tag, file, sources, options_.clock->Now() + kPullDeadline);
  if (!s.ok())
    TCE_LOG(kWarning, "weights") << "bringing " << file.path << " of job=" << tag.job << " for a following node: "
                                 << s.ToString();
  MutexLock lock(&mu_);
  fetching_.erase({tag.job, file.path});
  pulls_done_.push_back(id);
  changed_.SignalAll();
}

}  // namespace tce
