#include "ring/link_breaker.h"

#include <sys/socket.h>

namespace tce {

bool LinkBreaker::Add(int fd) {
  MutexLock l(&mu_);
  if (broken_) return false;
  fds_.insert(fd);
  return true;
}

void LinkBreaker::Remove(int fd) {
  MutexLock l(&mu_);
  fds_.erase(fd);
}

size_t LinkBreaker::BreakAll() {
  MutexLock l(&mu_);  // held: no registered fd is closed (and reused) meanwhile
  broken_ = true;
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  return fds_.size();
}

bool LinkBreaker::broken() const {
  MutexLock l(&mu_);
  return broken_;
}

}  // namespace tce
