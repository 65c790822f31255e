#include "env/fault_env.h"

#include <cerrno>

namespace tce {
namespace {

class FaultTempFile final : public TempFile {
 public:
  FaultTempFile(FaultInjectionEnv* env, std::unique_ptr<TempFile> base)
      : env_(env), base_(std::move(base)) {}
  Status Append(const char* data, size_t n) override {
    Status s = env_->BeforeAppend();
    return s.ok() ? base_->Append(data, n) : s;
  }
  Status WriteAt(uint64_t offset, const char* data, size_t n) override {
    Status s = env_->BeforeAppend();
    return s.ok() ? base_->WriteAt(offset, data, n) : s;
  }
  Status Sync() override { return base_->Sync(); }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Status Preallocate(uint64_t size) override {
    Status s = env_->BeforePreallocate();
    return s.ok() ? base_->Preallocate(size) : s;
  }
  Status StartWriteback(uint64_t offset, uint64_t n) override { return base_->StartWriteback(offset, n); }
  Status Close() override { return base_->Close(); }
  Status SetMode(uint32_t mode) override { return base_->SetMode(mode); }
  Status Stat(FileStat* out) override { return base_->Stat(out); }
  Status Publish(const std::string& name) override {
    Status s = env_->BeforeRename();
    if (!s.ok()) {
      base_->Discard();
      return s;
    }
    return base_->Publish(name);
  }
  void Discard() override { base_->Discard(); }

 private:
  FaultInjectionEnv* const env_;
  std::unique_ptr<TempFile> base_;
};

class FaultDirectory final : public Directory {
 public:
  FaultDirectory(FaultInjectionEnv* env, std::unique_ptr<Directory> base)
      : env_(env), base_(std::move(base)) {}
  Status NewTempFile(const std::string& prefix, bool direct, std::unique_ptr<TempFile>* out) override {
    std::unique_ptr<TempFile> file;
    Status s = base_->NewTempFile(prefix, direct, &file);
    if (s.ok()) out->reset(new FaultTempFile(env_, std::move(file)));
    return s;
  }
  Status RemoveTemps(const std::string& prefix, int* removed) override {
    return base_->RemoveTemps(prefix, removed);
  }
  Status Sync() override { return base_->Sync(); }
  Status Stat(FileStat* out) override {
    Status s = env_->BeforeStat();
    return s.ok() ? base_->Stat(out) : s;
  }
  Status StatAt(const std::string& name, FileStat* out) override {
    Status s = env_->BeforeStat();
    return s.ok() ? base_->StatAt(name, out) : s;
  }
  Status StatParent(FileStat* out) override {
    Status s = env_->BeforeStat();
    return s.ok() ? base_->StatParent(out) : s;
  }
  Status ReadAt(const std::string& name, uint64_t offset, uint64_t n, char* into) override {
    return base_->ReadAt(name, offset, n, into);
  }
  Status ReadPieces(const std::string& name, uint64_t offset, uint64_t n, size_t piece, const Sink& sink) override {
    return base_->ReadPieces(name, offset, n, piece, sink);
  }
  Status List(std::vector<std::pair<std::string, FileStat>>* out) override { return base_->List(out); }
  Status Remove(const std::string& name) override { return base_->Remove(name); }

 private:
  FaultInjectionEnv* const env_;
  std::unique_ptr<Directory> base_;
};

}  // namespace

Status FaultInjectionEnv::OpenDirectory(const std::string& root, const std::string& dir, bool create,
                                        std::unique_ptr<Directory>* out) {
  std::unique_ptr<Directory> base;
  Status s = base_->OpenDirectory(root, dir, create, &base);
  if (s.ok()) out->reset(new FaultDirectory(this, std::move(base)));
  return s;
}

Status FaultInjectionEnv::Stat(const std::string& path, FileStat* out) {
  Status s = BeforeStat();
  return s.ok() ? base_->Stat(path, out) : s;
}

Status FaultInjectionEnv::BeforeStat() {
  MutexLock l(&mu_);
  while (stats_blocked_) unblocked_.Wait(&mu_);
  if (stat_err_ != 0) return Status::FromErrno(stat_err_, "stat (injected)");
  return Status::OK();
}

void FaultInjectionEnv::FailStats(int err) {
  MutexLock l(&mu_);
  stat_err_ = err;
}

void FaultInjectionEnv::BlockStats() {
  MutexLock l(&mu_);
  stats_blocked_ = true;
}

void FaultInjectionEnv::UnblockStats() {
  {
    MutexLock l(&mu_);
    stats_blocked_ = false;
  }
  unblocked_.SignalAll();
}

Status FaultInjectionEnv::BeforeRename() {
  MutexLock l(&mu_);
  ++renames_;
  if (rename_failures_ > 0) {
    --rename_failures_;
    return Status::FromErrno(EIO, "rename (injected)");
  }
  return Status::OK();
}

void FaultInjectionEnv::FailAppends(int err, int count, int skip) {
  MutexLock l(&mu_);
  append_err_ = err;
  append_failures_ = count;
  append_skip_ = skip;
}

void FaultInjectionEnv::FailRenames(int count) {
  MutexLock l(&mu_);
  rename_failures_ = count;
}

int FaultInjectionEnv::appends() const {
  MutexLock l(&mu_);
  return appends_;
}

int FaultInjectionEnv::renames() const {
  MutexLock l(&mu_);
  return renames_;
}

void FaultInjectionEnv::FailPreallocations(int err) {
  MutexLock l(&mu_);
  preallocate_err_ = err;
}

int FaultInjectionEnv::preallocations() const {
  MutexLock l(&mu_);
  return preallocations_;
}

Status FaultInjectionEnv::BeforePreallocate() {
  MutexLock l(&mu_);
  ++preallocations_;
  if (preallocate_err_ == EOPNOTSUPP) return Status::NotSupported("fallocate (injected): not supported");
  if (preallocate_err_ != 0) return Status::FromErrno(preallocate_err_, "fallocate (injected)");
  return Status::OK();
}

Status FaultInjectionEnv::BeforeAppend() {
  MutexLock l(&mu_);
  ++appends_;
  if (append_skip_ > 0) {
    --append_skip_;
    return Status::OK();
  }
  if (append_failures_ > 0) {
    --append_failures_;
    return Status::FromErrno(append_err_, "write (injected)");
  }
  return Status::OK();
}

}  // namespace tce
