#include "cache/storage_check.h"

#include <sys/stat.h>

#include <deque>
#include <system_error>
#include <thread>

#include "common/mutex.h"

namespace tce {
namespace {

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

StorageCheck Changed(std::string why) { return {Verdict::kChanged, std::move(why)}; }
StorageCheck Unavailable(std::string why) { return {Verdict::kUnavailable, std::move(why)}; }

}  // namespace

Status SnapshotPath(const StorageRoots& roots, const std::string& path, DiskIdentity* out) {
  const std::string dir = Dirname(path);
  std::string resolved;
  std::unique_ptr<Directory> d;
  Status s = roots.OpenDirectory(dir, &d, &resolved);
  if (s.code() == Status::Code::kNotFound)
    return Status::NotFound("No such file or directory: " + dir + " (the directory of " + path +
                            ") does not exist");
  if (!s.ok()) return s;
  FileStat st;
  s = d->Stat(&st);
  if (!s.ok()) return s;
  *out = DiskIdentity();
  out->known = true;
  out->dir_dev = st.dev;
  out->dir_ino = st.ino;
  if (d->StatParent(&st).ok()) out->parent_ino = st.ino;
  s = d->StatAt(Basename(path), &st);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  if (S_ISDIR(st.mode)) return Status::FailedPrecondition("Is a directory: " + path);
  out->exists = true;
  out->dev = st.dev;
  out->ino = st.ino;
  out->size = st.size;
  out->mtime_ns = st.mtime_ns;
  out->mode = st.mode & 07777;
  return Status::OK();
}

StorageCheck CheckPath(const StorageRoots& roots, const std::string& path, const DiskIdentity& expected) {
  const std::string dir = Dirname(path);
  std::string resolved;
  std::unique_ptr<Directory> d;
  Status s = roots.OpenDirectory(dir, &d, &resolved);
  if (!s.ok()) return ClassifyOpenFailure(roots.env(), resolved.empty() ? dir : resolved, s, expected);
  StorageCheck c = CheckDirectory(d.get(), path, expected);
  if (c.verdict != Verdict::kSame) return c;
  FileStat now;
  bool exists = false;
  return CheckEntry(d.get(), path, Basename(path), expected, &now, &exists);
}

StorageCheck CheckPeerIdentity(const StorageRoots& roots, const std::string& path, const DiskIdentity& theirs,
                               DiskIdentity* now) {
  Status s = SnapshotPath(roots, path, now);
  if (s.code() == Status::Code::kNotFound) {  // no directory: removed here, or other storage?
    const std::string dir = Dirname(path);
    FileStat parent;
    Status p = roots.env()->Stat(Dirname(dir), &parent);
    if (p.ok() && theirs.parent_ino != 0 && parent.ino == theirs.parent_ino)
      return Changed("directory " + dir + " was removed");
    if (!p.ok() && p.code() != Status::Code::kNotFound) return Unavailable(p.ToString());
    return {Verdict::kElsewhere, dir + " does not exist on this node's storage"};
  }
  if (s.code() == Status::Code::kPermissionDenied || s.code() == Status::Code::kFailedPrecondition)
    return Changed(s.message());
  if (!s.ok()) return Unavailable(s.ToString());
  if (now->dir_ino != theirs.dir_ino) {
    if (theirs.parent_ino != 0 && now->parent_ino == theirs.parent_ino)
      return Changed("the directory of " + path + " was removed and made again");
    return {Verdict::kElsewhere, "the directory of " + path + " is not the one the copy's node saw"};
  }
  if (now->exists != theirs.exists)
    return Changed(theirs.exists ? path + " was deleted on storage" : "another file was written at " + path);
  if (now->exists && (now->ino != theirs.ino || now->size != theirs.size || now->mtime_ns != theirs.mtime_ns))
    return Changed(path + " was replaced or modified on storage");
  return {};
}

// ---- Prober ----

struct Prober::Core {
  struct Task {
    std::function<void()> fn;
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
  };
  Mutex mu;
  CondVar cv;
  std::deque<std::shared_ptr<Task>> queue GUARDED_BY(mu);
  int threads GUARDED_BY(mu) = 0;
  int idle GUARDED_BY(mu) = 0;
  bool stop GUARDED_BY(mu) = false;

  static void Loop(std::shared_ptr<Core> core) {
    MutexLock l(&core->mu);
    for (;;) {
      ++core->idle;
      while (core->queue.empty() && !core->stop) core->cv.Wait(&core->mu);
      --core->idle;
      if (core->queue.empty()) break;  // stopping
      std::shared_ptr<Task> t = core->queue.front();
      core->queue.pop_front();
      l.Unlock();
      t->fn();
      {
        MutexLock tl(&t->mu);
        t->done = true;
      }
      t->cv.SignalAll();
      l.Lock();
    }
    --core->threads;
  }
};

Prober::Prober(std::chrono::milliseconds timeout, Clock* clock, int max_stuck)
    : timeout_(timeout), clock_(clock), max_stuck_(max_stuck), core_(std::make_shared<Core>()) {}

Prober::~Prober() {
  {
    MutexLock l(&core_->mu);
    core_->stop = true;
  }
  core_->cv.SignalAll();  // idle threads end; stuck ones end when they return
}

bool Prober::Run(std::function<void()> fn) {
  if (timeout_.count() <= 0) {
    fn();
    return true;
  }
  auto task = std::make_shared<Core::Task>();
  task->fn = std::move(fn);
  {
    MutexLock l(&core_->mu);
    if (core_->idle <= static_cast<int>(core_->queue.size())) {
      // Every thread is busy: the busy ones beyond a normal load are stuck.
      if (core_->threads >= max_stuck_) return false;
      try {
        std::thread(Core::Loop, core_).detach();
      } catch (const std::system_error&) {  // out of threads: as if storage did not answer
        return false;
      }
      ++core_->threads;
    }
    core_->queue.push_back(task);
  }
  core_->cv.Signal();
  const auto deadline = clock_->Now() + timeout_;
  MutexLock tl(&task->mu);
  while (!task->done && clock_->WaitUntil(&task->cv, &task->mu, deadline)) {
  }
  return task->done;
}

}  // namespace tce
