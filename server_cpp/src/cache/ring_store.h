// RingStore: the Cache as the ring (ring/) sees it: the backup workers
// (ring/replicator.h) take the files and tags to send and report how it
// went, put back what a recovery pulled from the ring, and end restores;
// the peer port (ring/peer_server.h) and ranged reads (ring/range_reader.h)
// check who may hand over or read a job's files, and read this node's own
// files in memory; a load that misses (ring/ring_fetch.h) asks whether the
// ring may hold the file.
//
// Trust: peers are other servers of the cluster, authenticated by the
// caller (ring/peer_link.h), but what they say of a job is checked here
// against the ring this server was told (CheckRingSender) and the uid the
// job belongs to here (CheckPeerUid); a recovered file is checked again on
// adoption (AdoptRecovered).
//
// The Cache is one. Thread-safe: the backup workers, the peer port's
// connection threads and RPC threads call it at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cache/backup_feed.h"
#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "cache/load_split.h"
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

class RingStore {
 public:
  virtual ~RingStore() = default;

  // ---- the ring and who may act for a job ----
  // The other members of the job's ring, the successor first (empty: no ring).
  virtual std::vector<std::string> RingPeers(const std::string& job) = 0;
  // Every node of the job's ring, by node rank (empty: no ring, or one node).
  virtual std::vector<std::string> RingNodes(const std::string& job) = 0;
  // OK when `peer` is node `node` of the job's ring as this server was told
  // it: only that node may hand it copies and tags as that node's.
  // PERMISSION_DENIED naming who is, or that no ring is known.
  virtual Status CheckRingSender(const std::string& job, int32_t node, const std::string& peer) = 0;
  // The uid `job` belongs to here: the owner of its files, else the uid
  // that set its ring; false when nobody owns it here yet. A job belongs to
  // one uid on every node of its ring: peers name it with every copy, tag
  // and request (ring/peer_server.h), so a ring is the job's name and its
  // uid, not the name alone.
  virtual bool JobUid(const std::string& job, uid_t* uid) = 0;
  // OK when `peer` (acting for `job` as uid `uid`; `named` false: it named
  // none) may do `what`: the job belongs to that uid here, or to nobody
  // yet and `claim` (then it does from now on). Else PERMISSION_DENIED.
  virtual Status CheckPeerUid(const std::string& job, bool named, uid_t uid, const std::string& peer,
                              const std::string& what, bool claim) = 0;
  // Whether a load that missed (job, path) may find it in the ring: it is
  // unknown here, or lost from memory, but not evicted by us (the ring's
  // copy goes when the original is evicted).
  virtual bool MayBeInRing(const std::string& job, const std::string& path) = 0;

  // ---- cooperative restore: a tag read from storage once (docs/ring.md) ----
  // Whether `path` lies under a storage root (a directory or object root).
  virtual bool UnderStorage(const std::string& path) = 0;
  // Reads (job, path) from storage into the cache as the job's owner (once
  // a client set its ring here: NOT_FOUND before), unless it is in memory already
  // (OK); once at a time per file, every other load waits for that read.
  // `for_peer`: another node's plan named this one (counted apart).
  virtual Status LoadFromStorage(const std::string& job, const std::string& path, bool for_peer) = 0;
  // The files directly in `dir` on storage, with their sizes (as the job's
  // owner, for a directory root).
  virtual Status ListStorageDir(const std::string& job, const std::string& dir, std::vector<ListedObject>* out) = 0;
  // A load of `job` took `bytes` from `from`.
  virtual void NoteLoad(const std::string& job, LoadFrom from, uint64_t bytes) = 0;
  // As the file's node in the restore plan: the node that reads (job,
  // path) from storage for the ring, the first one named (for a while),
  // else `node` from now on.
  virtual std::string ClaimRead(const std::string& job, const std::string& path, const std::string& node) = 0;
  // `node` stopped answering: its claims on the job's files are dropped
  // (the next node that asks reads them). Returns how many.
  virtual size_t DropClaims(const std::string& job, const std::string& node) = 0;

  // ---- backups ----
  // Where the ring's work is queued (ring/backup_queue.h; null: nowhere, no
  // file is backed up). Set before serving.
  virtual void SetBackupFeed(BackupFeed* feed) = 0;
  // For backup workers: the current version of `key` to send to the job's
  // successor, pinned (until FinishBackup), in `out`; false when there is
  // nothing to send (no successor, not in memory, already held there).
  virtual bool StartBackup(const FileKey& key, BackupJob* out) = 0;
  // Records the outcome. A failed backup is queued again (the worker backs
  // off); the file itself is unaffected.
  virtual void FinishBackup(const BackupJob& job, const Status& result) = 0;
  // For backup workers: the complete tag `copy` names, the job's successor
  // to send it to and this node's rank in the ring; false when there is
  // nothing to send (no successor, no such tag).
  virtual bool StartTagBackup(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) = 0;
  // `peer` lost the copies it held for us: send the job's files again.
  virtual void ResendBackups(const std::string& job, const std::string& peer) = 0;
  // Counts a ring failure that belongs to no queued job (shown in Stats).
  virtual void NoteBackupError(const std::string& message) = 0;
  // The outcome of one attempt of the backup workers (a backup, a tag, a
  // drop or a restore) with the next node: a run of failures (the Cache's
  // kBackupsFailingLoudly or more) is logged as an error (at most once a
  // minute); any success ends the run (Stats' backup_failing).
  virtual void NoteRingAttempt(const Status& result, const std::string& what) = 0;

  // ---- recovery: this node's files and tags back from the ring ----
  // Room (within the budget) for a file pulled back from the ring.
  virtual Status ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // Installs a pulled file (CRCs verified) as BACKED_UP at `f.backup_holder`,
  // unless a save of the path arrived meanwhile (FAILED_PRECONDITION) or its
  // size or CRCs differ from those metadata recorded for the path (DATA_LOSS:
  // the copy is not the file metadata knows, and storage serves it instead).
  // Nothing the peer says is taken on trust: the job, tag and path must be
  // valid names under the storage roots (else PERMISSION_DENIED), and the
  // owner is metadata's, or the job's owner once a client set its ring
  // here; a file with neither is refused (PERMISSION_DENIED).
  virtual Status AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem) = 0;
  virtual void AbandonRecovery(std::unique_ptr<Buffer> mem) = 0;
  // Complete tags of `job` this node recorded before it was replaced, as
  // its successor held them (checked by the caller: valid, of `job`). Each
  // is kept unless one as new is recorded here, and told to metadata.
  // Returns how many were kept.
  virtual size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) = 0;
  // Whether a complete tag the ring gave back agrees with the files it
  // names: each is in memory here at the tag's size; or, not being one of
  // `listed` (the holder's copies of this node's files: those must be back),
  // it is another node's, and storage holds nothing else at its path
  // (nothing, or a file of the tag's size; storage that does not answer
  // cannot refuse). FAILED_PRECONDITION naming the first file that
  // disagrees: such a tag is not listed again.
  virtual Status CheckRecoveredTag(const TagInfo& tag, const std::set<std::string>& listed) = 0;
  // The Replicator pulled back what the ring held of `job` (whatever it
  // got): loads waiting for it go on.
  // `from` non-empty: only a restore from that peer ends.
  virtual void RestoreEnded(const std::string& job, const std::string& from) = 0;
  // Files of `job` that metadata recorded here and that are not in memory
  // (after a restore: what the ring could not give back).
  virtual std::vector<FileInfo> NotInMemory(const std::string& job) = 0;

  // ---- tag markers on object storage across nodes ----
  // A tag's marker (DCP's `.metadata`, DeepSpeed's `latest`) under an object
  // root is uploaded only once every file of its tag is durable. On a job
  // whose ring has other nodes, the marker's node waits for the tag's record
  // (CommitTag) and then for the other nodes to report their files of the
  // tag durable (ring/tag_barrier.h asks them).
  struct HeldMarker {
    FileKey key;
    uint64_t version = 0;
    std::vector<std::string> remote;  // the tag's files that are not this node's
  };
  // The markers whose own node's files are durable and that wait for other
  // nodes' files (counted as one round when there are any).
  virtual std::vector<HeldMarker> MarkersAwaitingPeers() = 0;
  // Every node reported the other files of the marker's tag durable: the
  // marker (that version of it) is uploaded now.
  virtual void PeersDurable(const FileKey& marker, uint64_t version) = 0;
  // For a ring member's question: those of `paths` (files of `job`) this
  // node has persisted (PERSISTED, or EVICTED since).
  virtual std::vector<std::string> DurableOf(const std::string& job, const std::vector<std::string>& paths) = 0;

  // ---- peer reads ----
  // How many committed files of `job` this node holds in memory.
  virtual size_t InMemoryCount(const std::string& job) = 0;
  // For a ring member's read (ring/peer_server.h; the caller checked that
  // the peer is a member of the job's ring): the committed file (job, path)
  // this node holds in memory, its buffer pinned and a read-only fd in *fd
  // until EndPeerRead(out->buffer_id). NOT_FOUND if not in memory.
  virtual Status StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) = 0;
  virtual void EndPeerRead(uint64_t buffer_id) = 0;

  // ---- published versions for nodes that follow a job (docs/weights.md) ----
  // For a following node (`node`: the endpoint its link authenticated,
  // never a request's field): OK when the job's owner granted that node
  // read of its versions (GrantRead, or as the source of a job this node
  // follows passed the grants on), then the newest version above `after`
  // (any version, when `epoch`, the numbering `after` is of, is set and is
  // not the job's here),
  // waiting up to `wait` (DEADLINE_EXCEEDED when none came; *nodes set).
  // NOT_FOUND when the job is not here; PERMISSION_DENIED, naming no uid,
  // when the node is not granted. The tag lists the version's weight files only
  // (cache/weight_files.h). *nodes: the nodes granted the job.
  virtual Status PeerGetVersion(const std::string& job, uint64_t after, uint64_t epoch,
                                std::chrono::milliseconds wait, const std::string& node, TagInfo* out,
                                std::vector<std::string>* nodes) = 0;
  // The digests (TagFile.crc32) a following node is given with a version,
  // which only the node that published it computes, from its own memory
  // (ring/peer_server_reads.cc): fills *tag's files with those recorded for
  // that version here, and gives a pinned read-only fd of each other file
  // of it this node holds of its own in memory as that version (never a
  // replica's: a replica's digest is its source's). EndPeerRead each pin.
  struct DigestPin {
    size_t file = 0;  // its index in tag->files
    uint64_t buffer_id = 0;
    int fd = -1;
  };
  virtual void VersionDigests(TagInfo* tag, std::vector<DigestPin>* pins) = 0;
  // Records the digests of `tag`'s files this node computed (those set).
  virtual void RecordDigests(const TagInfo& tag) = 0;
  // For such a node's ranged read: OK when the node is granted and `path`
  // is a weight file of the version recorded here as `tag`.
  virtual Status CheckPeerVersionRead(const std::string& job, const std::string& tag, const std::string& path,
                                      const std::string& node) = 0;
  // A buffer for a replica of `size` bytes of `job`'s version: a FREE buffer
  // of the job's owner that fits, reused (its id, and the sessions that keep
  // it mapped, stay: a reader's mapping of it is current again once the
  // replica is adopted), else a new one as ReserveRecovery makes. Give it
  // to AdoptReplica or AbandonRecovery.
  virtual Status ReserveReplica(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // A local user of uid `reader` follows `job`: the job belongs here to
  // `owner` (this server's own uid, never a uid a source names;
  // FAILED_PRECONDITION when another uid's job has the name) and `reader`
  // may read its versions.
  virtual Status AddFollower(const std::string& job, uid_t owner, uid_t reader) = 0;
  // A version of a job this node follows (AddFollower first), as a source
  // gave it: recorded with its number and epoch (TagRegistry::Follow:
  // DATA_LOSS for a version that jumps too far).
  virtual Status AdoptFollowed(TagInfo tag) = 0;
  // The nodes a source of a job this node follows says the owner granted:
  // this node serves them the versions it holds (a chain of nodes).
  virtual void PassOnGrants(const std::string& job, const std::vector<std::string>& nodes) = 0;
  // A file of a followed version, brought here into `mem` (from
  // ReserveRecovery): held as a replica of that version (never persisted,
  // backed up or recorded; evictable once no lease holds it).
  virtual Status AdoptReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) = 0;
  // As StartPeerRead, for a follower's reader (CheckPeerVersionRead passed):
  // the file as the version recorded here as `tag` published it (this
  // node's own, or the replica brought for it); NOT_FOUND when this node
  // does not hold that version of it.
  virtual Status StartVersionRead(const std::string& job, const std::string& path, const std::string& tag,
                                  FileInfo* out, int* fd) = 0;
  // A following node's ranged read of a version was served (from memory or
  // a transfer in flight here): counted for Status.
  virtual void NoteVersionRangeServed() = 0;
  // The version recorded here as (job, tag); false when none.
  virtual bool VersionTag(const std::string& job, const std::string& tag, TagInfo* out) = 0;
  // Whether this node holds (job, path) in memory for the version recorded
  // as `tag`: its own file, or a replica brought for that version.
  virtual bool HoldsInMemory(const std::string& job, const std::string& path, const std::string& tag) = 0;
};

}  // namespace tce
