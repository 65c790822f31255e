// ObjectRoots: the object storage roots of `storage_roots` (DIR=URL), each a
// directory prefix mapped to a store and a key prefix. Built once at start
// (storage/backends.h: OpenObjectRoots) and read by every thread.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "storage/object_store.h"

namespace tce {

struct ObjectRoot {
  std::string dir;     // absolute, normalised, no trailing slash
  std::string url;     // as configured
  std::string prefix;  // key prefix: "" or ending in '/'
  std::shared_ptr<ObjectStore> store;
};

class ObjectRoots {
 public:
  ObjectRoots() = default;
  ObjectRoots(const ObjectRoots&) = delete;
  ObjectRoots& operator=(const ObjectRoots&) = delete;
  ~ObjectRoots() { CancelAll(); }
  void Add(ObjectRoot root) { roots_.push_back(std::move(root)); }
  bool empty() const { return roots_.empty(); }
  const std::vector<ObjectRoot>& all() const { return roots_; }
  // The root `path` (absolute, normalised) lies under (the longest), and its
  // key; null when none. Lexical: an object root has no directories to
  // resolve, and `..` was refused before.
  const ObjectRoot* Find(const std::string& path, std::string* key) const;
  // At start, on a thread of its own (an endpoint that is down must not
  // hold the server's start): each store abandons what a crash left.
  void AbandonUnfinishedInBackground();
  // Ends every transfer in progress and the background abandoning.
  void CancelAll();

 private:
  std::vector<ObjectRoot> roots_;
  std::thread abandoning_;
};

// Whether `path` names a tag's completeness marker: DCP's `.metadata`,
// DeepSpeed's `latest`. Written to object storage after the tag's other
// files, deleted before them.
bool IsTagMarker(const std::string& path);

// Splits `storage_roots` ("DIR" or "DIR=URL", comma-separated) into
// filesystem roots and object roots (the URL's scheme must be a backend's
// of storage/backends.h, other than file://; stores not opened).
Status ParseStorageRoots(const std::string& text, std::vector<std::string>* dirs,
                         std::vector<std::pair<std::string, std::string>>* objects);

}  // namespace tce
