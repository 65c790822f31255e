#include "daemon/metrics_endpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <utility>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

#include "cache/file_state.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"

namespace tce {

namespace {

constexpr size_t kMaxRequest = 8192;
// After the reply, how long unread request bytes are drained before the close
// (closing with them unread would reset the connection and could destroy the
// reply in flight).
constexpr std::chrono::milliseconds kLinger(200);

// One connection's socket (non-blocking) with the deadline its every wait
// ends at; a readable `wake_fd` (Stop) ends the waits too.
struct Conn {
  int fd;
  int wake_fd;
  Clock::TimePoint deadline;  // on the real clock: poll(2) waits in real time

  // Whether `fd` became ready for `events` (or failed: the next call says how)
  // before the deadline and before Stop.
  bool Wait(short events) const {
    while (true) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::Real()->Now());
      if (left.count() <= 0) return false;
      pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
      const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 60000)));
      if (n < 0 && errno != EINTR) return false;
      if (n <= 0) continue;
      if (fds[1].revents) return false;
      if (fds[0].revents) return true;
    }
  }

  // Bytes read (0: the peer closed), or -1: failed, past the deadline, or stopping.
  ssize_t Recv(char* buf, size_t len) const {
    while (true) {
      const ssize_t n = recv(fd, buf, len, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if ((errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(POLLIN)) return -1;
    }
  }

  void SendAll(const std::string& out) const {
    size_t off = 0;
    while (off < out.size()) {
      const ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(POLLOUT)) {
        return;  // the scraper went away, stopped reading past the deadline, or we stop
      }
    }
  }
};

std::string Response(const char* status, const std::string& body, bool head = false) {
  std::string out = std::string("HTTP/1.1 ") + status +
                    "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  return out;
}

void Reply(const Conn& c, const char* status, const std::string& body, bool head = false) {
  c.SendAll(Response(status, body, head));
}

// Reads one request and answers it, all before the connection's deadline.
void Handle(const Conn& c, const std::function<std::string()>& render) {
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() >= kMaxRequest) return Reply(c, "431 Request Header Fields Too Large", "request too large\n");
    const ssize_t n = c.Recv(buf, sizeof(buf));
    if (n <= 0) return;  // closed, or no whole request by the deadline: nothing to answer
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0)
    return Reply(c, "400 Bad Request", "expected: GET /metrics HTTP/1.1\n");
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  if (target != "/metrics") return Reply(c, "404 Not Found", "not found: only /metrics is served\n");
  if (method != "GET" && method != "HEAD") return Reply(c, "405 Method Not Allowed", "GET or HEAD only\n");
  Reply(c, "200 OK", render(), method == "HEAD");
}

}  // namespace

MetricsServer::MetricsServer(std::string listen, std::function<std::string()> render,
                             MetricsServerLimits limits)
    : listen_(std::move(listen)), render_(std::move(render)), limits_(limits) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start() {
  Status s = ListenTcp(listen_, &listen_fd_, &endpoint_);
  if (!s.ok()) return s;
  const int flags = fcntl(listen_fd_, F_GETFL);
  if (flags < 0 || fcntl(listen_fd_, F_SETFL, flags | O_NONBLOCK) != 0)
    return Status::FromErrno(errno, "metrics listener");
  if ((wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) return Status::FromErrno(errno, "eventfd");
  // Fewer workers than asked for still serve (more slowly under slow
  // clients); with none, the accepting thread serves each connection itself.
  workers_.reserve(static_cast<size_t>(std::max(limits_.workers, 0)));
  for (int i = 0; i < limits_.workers; ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      TCE_LOG(kWarning, "metrics") << "started " << i << " of " << limits_.workers
                                   << " workers (" << e.what() << "): serving on fewer";
      break;
    }
  }
  {
    MutexLock lock(&mu_);
    capacity_ = static_cast<int>(workers_.size()) + std::max(limits_.waiting, 0);
  }
  try {
    acceptor_ = std::thread([this] { AcceptLoop(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(std::string("metrics: no thread to accept connections: ") + e.what());
  }
  TCE_LOG(kInfo, "metrics") << "serving Prometheus metrics at http://" << endpoint_ << "/metrics";
  return Status::OK();
}

void MetricsServer::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  work_.SignalAll();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));  // every poll in here returns
    (void)ignored;
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  {
    MutexLock lock(&mu_);
    for (int fd : waiting_) ::close(fd);
    waiting_.clear();
  }
  for (int* fd : {&listen_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void MetricsServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      TCE_LOG(kError, "metrics") << "poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Admit(fd);
      continue;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED || err == EAGAIN || err == EWOULDBLOCK) continue;
    // Out of fds or memory, for now: the connection stays in the backlog, and
    // accepting resumes shortly (poll would report it again at once).
    uint64_t dropped = 0;
    if (accept_log_.Allow(&dropped))
      TCE_LOG(kWarning, "metrics") << "accept: " << std::strerror(err) << Suppressed(dropped);
    pollfd wake = {wake_fd_, POLLIN, 0};
    if (poll(&wake, 1, 100) > 0) return;
  }
}

void MetricsServer::Admit(int fd) {
  if (workers_.empty()) return Serve(fd);
  int in_hand = 0;
  {
    MutexLock lock(&mu_);
    if (in_hand_ < capacity_) {
      ++in_hand_;
      waiting_.push_back(fd);
      work_.Signal();
      return;
    }
    in_hand = in_hand_;
  }
  // Every worker busy and the wait full: say so and hang up at once. The
  // socket is fresh, so the whole short reply fits its buffer.
  const std::string busy = Response("503 Service Unavailable", "too many connections to the metrics endpoint\n");
  ssize_t ignored = send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
  ::close(fd);
  uint64_t dropped = 0;
  if (refused_log_.Allow(&dropped))
    TCE_LOG(kWarning, "metrics") << "refused a connection: " << in_hand
                                 << " are already being served or waiting (slow scrapers?)" << Suppressed(dropped);
}

void MetricsServer::WorkerLoop() {
  while (true) {
    int fd = -1;
    {
      MutexLock lock(&mu_);
      while (waiting_.empty() && !stopping_) work_.Wait(&mu_);
      if (stopping_) return;  // Stop closes the connections still waiting
      fd = waiting_.front();
      waiting_.pop_front();
    }
    Serve(fd);
    MutexLock lock(&mu_);
    --in_hand_;
  }
}

void MetricsServer::Serve(int fd) {
  Conn c{fd, wake_fd_, Clock::Real()->Now() + limits_.deadline};
  Handle(c, render_);
  // End our side, then drop what the client still sends, briefly.
  shutdown(fd, SHUT_WR);
  c.deadline = Clock::Real()->Now() + kLinger;
  char sink[4096];
  for (int i = 0; i < 16 && c.Recv(sink, sizeof(sink)) > 0; ++i) {
  }
  ::close(fd);
}

namespace {

// The operations under way (StatusResponse.operations): how many of each
// kind, and per kind and job what is left of those whose totals are known.
void RenderOperations(const v1::StatusResponse& st, PromText* m) {
  std::map<std::string, uint64_t> running = {{"prefetch", 0}, {"ring_restore", 0}};
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> left;  // (kind, job) -> files, bytes
  for (const v1::RunningOperation& op : st.operations()) {
    std::string kind = op.kind();
    std::replace(kind.begin(), kind.end(), ' ', '_');
    ++running[kind];
    if (op.files_total() == 0) continue;
    std::pair<uint64_t, uint64_t>& l = left[{kind, op.job()}];
    l.first += op.files_total() > op.files_done() ? op.files_total() - op.files_done() : 0;
    l.second += op.bytes_total() > op.bytes_done() ? op.bytes_total() - op.bytes_done() : 0;
  }
  for (const auto& [kind, n] : running)
    m->Gauge("tce_operations", "operations under way, by kind (prefetch, ring_restore)", static_cast<double>(n),
             {{"kind", kind}});
  for (const auto& [key, l] : left)
    m->Gauge("tce_operation_files_left", "files the operations under way have still to read, by kind and job",
             static_cast<double>(l.first), {{"kind", key.first}, {"job", key.second}});
  for (const auto& [key, l] : left)
    m->Gauge("tce_operation_bytes_left", "bytes of those files (where their sizes are known), by kind and job",
             static_cast<double>(l.second), {{"kind", key.first}, {"job", key.second}});
}

}  // namespace

std::string RenderMetrics(const v1::StatusResponse& st, const CacheStats& stats,
                          const TransferMetrics& persist, const TransferMetrics& backup) {
  PromText m;
  m.Gauge("tce_up", "1 while the server runs", 1, {{"version", st.version()}});
  m.Gauge("tce_accepting_saves", "0 once a shutdown drain has begun", stats.accepting ? 1 : 0);
  m.Gauge("tce_uptime_seconds", "seconds since the server started", st.uptime_s());
  m.Gauge("tce_budget_bytes", "cache memory budget (the backup share excluded)",
          static_cast<double>(st.budget_bytes()));
  m.Gauge("tce_used_bytes", "cache memory in use (every buffer)", static_cast<double>(st.used_bytes()));
  m.Gauge("tce_cached_bytes", "bytes of buffers holding committed files", static_cast<double>(st.cached_bytes()));
  m.Gauge("tce_pending_bytes", "bytes of buffers being written by a save", static_cast<double>(st.pending_bytes()));
  m.Gauge("tce_free_bytes", "bytes of buffers ready for reuse", static_cast<double>(st.free_bytes()));
  m.Gauge("tce_buffers", "memfd buffers", static_cast<double>(st.buffers()));
  m.Gauge("tce_memory_backing", "1 for what new buffers are made of", 1, {{"backing", st.memory_backing()}});
  m.Gauge("tce_huge_page_buffers", "buffers backed by huge pages", static_cast<double>(st.huge_page_buffers()));
  m.Gauge("tce_pool_target_bytes", "bytes the pre-faulted pool fills up to", static_cast<double>(st.pool_target_bytes()));
  m.Gauge("tce_pool_bytes", "bytes pre-faulted and waiting for a new buffer", static_cast<double>(st.pool_bytes()));
  m.Counter("tce_pool_taken_total", "new buffers made from the pre-faulted pool", static_cast<double>(st.pool_taken()));
  m.Counter("tce_pool_missed_total", "new buffers made while the pool was empty", static_cast<double>(st.pool_missed()));
  m.Counter("tce_hugetlb_fallbacks_total", "buffers made with 4 KiB pages because no huge page was left",
            static_cast<double>(st.hugetlb_fallbacks()));
  m.Gauge("tce_sessions", "open client sessions", static_cast<double>(st.sessions()));
  m.Gauge("tce_leases", "files mapped by loading clients", static_cast<double>(st.leases()));
  m.Gauge("tce_version_leases", "readers' leases on published versions", static_cast<double>(st.version_leases()));
  m.Counter("tce_versions_published_total", "versions recorded: complete tags, and followed jobs' versions learned",
            static_cast<double>(st.versions_published()));
  m.Gauge("tce_replica_files", "files of followed versions brought from other nodes",
          static_cast<double>(st.replica_files()));
  m.Counter("tce_version_ranges_served_total", "ranged reads of published versions served to following nodes",
            static_cast<double>(st.version_ranges_served()));
  uint64_t following = 0, retrying = 0;
  for (const v1::FollowedJob& j : st.followed_jobs()) (j.state() == v1::FOLLOW_STATE_RETRYING ? retrying : following)++;
  m.Gauge("tce_followed_jobs", "jobs this node follows, by state", static_cast<double>(following),
          {{"state", "following"}});
  m.Gauge("tce_followed_jobs", "jobs this node follows, by state", static_cast<double>(retrying),
          {{"state", "retrying"}});
  for (const v1::VersionReaders& r : st.version_readers())
    m.Gauge("tce_version_reader_lag",
            "versions between a job's newest version and the oldest one a reader holds a lease on (0: all on the newest)",
            static_cast<double>(r.newest_version() > r.oldest_leased() ? r.newest_version() - r.oldest_leased() : 0),
            {{"job", r.job()}});
  RenderOperations(st, &m);
  for (const FileStateRow& row : kFileStates)
    m.Gauge("tce_files", "files the server knows, by state",
            static_cast<double>(stats.files_by_state[static_cast<int>(row.state)]), {{"state", row.metrics_label}});
  m.Gauge("tce_persist_queue", "files waiting for or in persistence", static_cast<double>(st.persist_queue()));
  // By storage root, labelled as storage_roots names it (each family's samples together).
  auto by_root = [&](const char* name, const char* help, bool counter, uint64_t (v1::RootStatus::*field)() const) {
    for (const v1::RootStatus& r : st.roots()) {
      const double value = static_cast<double>((r.*field)());
      if (counter) {
        m.Counter(name, help, value, {{"root", r.root()}});
      } else {
        m.Gauge(name, help, value, {{"root", r.root()}});
      }
    }
  };
  by_root("tce_root_queue_files", "committed files waiting for or in persistence, by storage root", false,
          &v1::RootStatus::queued_files);
  by_root("tce_root_queue_bytes", "bytes of those files, by storage root", false, &v1::RootStatus::queued_bytes);
  by_root("tce_root_written_bytes_total", "bytes persisted, by storage root", true, &v1::RootStatus::written_bytes);
  by_root("tce_root_failed_files", "files persistence gave up on, by storage root", false,
          &v1::RootStatus::failed_files);
  m.Gauge("tce_backup_queue", "files waiting for or in a backup", static_cast<double>(st.backup_queue()));
  m.Gauge("tce_backup_lag_bytes", "bytes cached but not yet backed up", static_cast<double>(st.backup_lag_bytes()));
  m.Gauge("tce_backup_consecutive_failures",
          "backup attempts failed in a row since the last that went through (0: backups work)",
          static_cast<double>(st.backup_failing()));
  m.Gauge("tce_metadata_queue", "metadata changes not yet written", static_cast<double>(st.metadata_queue()));
  m.Gauge("tce_metadata_healthy", "1 while the metadata store accepts writes", st.metadata_healthy() ? 1 : 0);
  m.Gauge("tce_held_backups", "predecessor files this server holds", static_cast<double>(st.held_backups()));
  m.Gauge("tce_held_backup_bytes", "bytes of predecessor backups held", static_cast<double>(st.held_backup_bytes()));
  m.Gauge("tce_held_tags", "predecessor complete tags held", static_cast<double>(st.held_tags()));
  m.Gauge("tce_metadata_bytes", "records clients made the server keep (tags, job names, grants, version leases)",
          static_cast<double>(st.metadata_bytes()));
  m.Gauge("tce_metadata_budget_bytes", "the most those records may take (metadata_budget)",
          static_cast<double>(st.metadata_budget()));
  m.Counter("tce_saves_total", "memfd buffers created and reused for saves",
            static_cast<double>(st.buffers_created() + st.buffers_reused()));
  m.Counter("tce_persisted_files_total", "files persisted", static_cast<double>(st.persisted_files()));
  m.Counter("tce_persisted_bytes_total", "bytes persisted", static_cast<double>(st.persisted_bytes()));
  m.Counter("tce_backed_up_files_total", "files backed up to the next node", static_cast<double>(st.backed_up_files()));
  m.Counter("tce_backed_up_bytes_total", "bytes backed up to the next node",
            static_cast<double>(backup.bytes.load()));
  m.Counter("tce_evicted_files_total", "files evicted from memory", static_cast<double>(st.evicted_files()));
  m.Counter("tce_discarded_files_total", "saves dropped: their path was removed or replaced on storage",
            static_cast<double>(st.discarded_files()));
  m.Counter("tce_objects_fetched_total", "files loads brought from object storage (S3) into the cache",
            static_cast<double>(st.objects_fetched()));
  m.Counter("tce_object_bytes_fetched_total", "bytes of those files", static_cast<double>(st.object_bytes_fetched()));
  m.Counter("tce_object_retries_total", "object storage requests retried (throttling, 5xx, timeouts)",
            static_cast<double>(st.object_retries()));
  m.Gauge("tce_held_markers", "tag markers held off object storage until their tag's files are durable",
          static_cast<double>(st.held_markers()));
  m.Counter("tce_stale_drops_total", "cached copies dropped at a load: storage holds another file, or none",
            static_cast<double>(st.stale_drops()));
  m.Counter("tce_storage_fallbacks_total", "loads served from the cache because storage could not be checked",
            static_cast<double>(st.storage_fallbacks()));
  m.Counter("tce_recovered_files_total", "files pulled back from the ring", static_cast<double>(st.recovered_files()));
  m.Counter("tce_remote_reads_total", "loads served from a peer's backup", static_cast<double>(st.remote_reads()));
  m.Counter("tce_range_reads_local_total", "ranged reads served from this cache", static_cast<double>(st.range_reads_local()));
  m.Counter("tce_range_reads_held_total", "ranged reads served from a copy held for a peer", static_cast<double>(st.range_reads_held()));
  m.Counter("tce_range_reads_peer_total", "ranged reads served by a ring peer", static_cast<double>(st.range_reads_peer()));
  m.Counter("tce_range_peer_bytes_total", "bytes ranged reads brought from ring peers", static_cast<double>(st.range_peer_bytes()));
  uint64_t by_source[3] = {0, 0, 0};  // cache, peer, storage: summed over jobs (no job names in labels)
  for (const v1::JobLoads& j : st.job_loads()) {
    by_source[0] += j.cache_bytes();
    by_source[1] += j.peer_bytes();
    by_source[2] += j.storage_bytes();
  }
  const char* kLoads = "bytes loads took from this node's memory, other nodes' memory, or storage";
  m.Counter("tce_load_bytes_total", kLoads, static_cast<double>(by_source[0]), {{"source", "cache"}});
  m.Counter("tce_load_bytes_total", kLoads, static_cast<double>(by_source[1]), {{"source", "peer"}});
  m.Counter("tce_load_bytes_total", kLoads, static_cast<double>(by_source[2]), {{"source", "storage"}});
  const char* kFailures = "failures, by reason";
  m.Counter("tce_failures_total", kFailures, static_cast<double>(persist.failures.load()), {{"reason", "persist_write"}});
  m.Counter("tce_failures_total", kFailures, static_cast<double>(st.backup_failures()), {{"reason", "backup"}});
  m.Counter("tce_failures_total", kFailures, static_cast<double>(st.ring_checksum_mismatches()),
            {{"reason", "ring_checksum"}});
  m.Gauge("tce_failed_files", "files persistence gave up on (state failed)", static_cast<double>(st.failed_files()));
  m.AddHistogram("tce_persist_seconds", "time to persist one file", persist.seconds);
  m.AddHistogram("tce_persist_megabytes_per_second", "throughput of one file's persistence",
                 persist.megabytes_per_second);
  m.AddHistogram("tce_backup_seconds", "time to back up one file to the next node", backup.seconds);
  m.AddHistogram("tce_backup_megabytes_per_second", "throughput of one file's backup",
                 backup.megabytes_per_second);
  return m.text();
}

}  // namespace tce
