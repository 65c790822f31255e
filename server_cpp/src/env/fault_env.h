// FaultInjectionEnv: wraps another Env and fails chosen operations the way a
// full disk, a dying disk or a crash would. For tests; thread-safe.
#pragma once


#include "common/mutex.h"
#include "env/env.h"

namespace tce {

class FaultInjectionEnv final : public Env {
 public:
  explicit FaultInjectionEnv(Env* base) : base_(base) {}

  // The next `count` Appends fail with `err` (ENOSPC, EIO, ...), after
  // `skip` more succeed.
  void FailAppends(int err, int count, int skip = 0);
  // The next `count` publishes (the rename into place) fail with EIO, as if
  // the process died before it.
  void FailRenames(int count);
  // Every reservation of a file's blocks (Preallocate) fails with `err`
  // from now on (ENOSPC; EOPNOTSUPP, a filesystem without fallocate); 0
  // ends it. Counts them.
  void FailPreallocations(int err);
  int preallocations() const;
  int appends() const;
  int renames() const;
  // Every stat (of a path, a directory or an entry in it) fails with `err`
  // from now on (EIO, ESTALE...); 0 ends it.
  void FailStats(int err);
  // Stats block from now on until UnblockStats, as on a hung NFS server.
  void BlockStats();
  void UnblockStats();

  Status CreateDirs(const std::string& dir) override { return base_->CreateDirs(dir); }
  Status ResolvePath(const std::string& p, std::string* out) override {
    return base_->ResolvePath(p, out);
  }
  Status Stat(const std::string& path, FileStat* out) override;
  // Its directories' temp files fail appends and publishes as above.
  Status OpenDirectory(const std::string& root, const std::string& dir, bool create,
                       std::unique_ptr<Directory>* out) override;

  // Called by the files it creates.
  Status BeforeAppend();
  Status BeforePreallocate();
  Status BeforeRename();
  Status BeforeStat();

 private:
  Env* const base_;
  mutable Mutex mu_;
  int append_err_ GUARDED_BY(mu_) = 0;
  int append_failures_ GUARDED_BY(mu_) = 0;
  int rename_failures_ GUARDED_BY(mu_) = 0;
  int append_skip_ GUARDED_BY(mu_) = 0;
  int appends_ GUARDED_BY(mu_) = 0;
  int renames_ GUARDED_BY(mu_) = 0;
  int stat_err_ GUARDED_BY(mu_) = 0;
  int preallocate_err_ GUARDED_BY(mu_) = 0;
  int preallocations_ GUARDED_BY(mu_) = 0;
  bool stats_blocked_ GUARDED_BY(mu_) = false;
  CondVar unblocked_;
};

}  // namespace tce
