// TagBarrier: on a job whose ring spans several nodes, a tag's marker for
// object storage (DCP's `.metadata`, DeepSpeed's `latest`) is held on its
// node until the other nodes' files of the tag are durable too, so the
// bucket never shows a tag complete whose files are not all there (see
// RingStore::MarkersAwaitingPeers). Every `interval`, while markers wait,
// one thread asks each other node of their job's ring (PeerDurable) which
// of the tag's files it has persisted; once every one of them is reported
// durable by some node, the marker is released to the persister. A node
// that does not answer, or holds a file not yet persisted, keeps the marker
// held: a tag whose files are lost never gets its marker on storage.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/ring_store.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "ring/link_breaker.h"
#include "ring/peer_key.h"

namespace tce {

struct TagBarrierOptions {
  std::string self;  // our advertised peer endpoint
  PeerKey key;       // the cluster token (and this node's certificate)
  std::chrono::milliseconds interval{500};
  std::chrono::milliseconds io_timeout{30000};
  LinkBreaker* breaker = nullptr;  // ends every wait on a peer when the server stops (optional)
  Clock* clock = Clock::Real();
};

class TagBarrier {
 public:
  TagBarrier(RingStore* cache, RingMembers* members, TagBarrierOptions options);
  ~TagBarrier();
  void Start();
  void Stop();
  // One round: asks the peers about the files of every held marker's tag
  // and releases the markers whose files are all durable.
  void CheckOnce();

 private:
  void Loop();
  // Adds to `durable` those of `paths` (files of `job`, sorted) that `peer` has persisted.
  Status Ask(const std::string& peer, const std::string& job, const std::vector<std::string>& paths,
             std::set<std::string>* durable);

  RingStore* const cache_;
  RingMembers* const members_;  // the job's peers and uid
  const TagBarrierOptions options_;
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
