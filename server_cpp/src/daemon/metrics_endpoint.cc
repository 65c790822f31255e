#include "daemon/metrics_endpoint.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cache/file_state.h"
#include "common/logging.h"
#include "common/net.h"

namespace tce {

MetricsServer::MetricsServer(std::string listen, std::function<std::string()> render,
                             std::chrono::milliseconds io_timeout)
    : listen_(std::move(listen)), render_(std::move(render)), io_timeout_(io_timeout) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start() {
  Status s = ListenTcp(listen_, &listen_fd_, &endpoint_);
  if (!s.ok()) return s;
  TCE_LOG(kInfo, "metrics") << "serving Prometheus metrics at http://" << endpoint_ << "/metrics";
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void MetricsServer::Stop() {
  if (stop_.exchange(true)) return;
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsServer::Loop() {
  while (!stop_) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!stop_) TCE_LOG(kError, "metrics") << "accept: " << std::strerror(errno);
      return;
    }
    Serve(fd);
    // Closing with unread request bytes would reset the connection and could
    // destroy the reply in flight: end our side, then drop what is left.
    shutdown(fd, SHUT_WR);
    SetIoTimeouts(fd, std::chrono::milliseconds(200));
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof(sink), 0) > 0; ++i) {
    }
    ::close(fd);
  }
}

namespace {

void Reply(int fd, const char* status, const std::string& body, bool head = false) {
  std::string out = std::string("HTTP/1.1 ") + status +
                    "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the scraper went away (or stalled past the timeout)
    off += static_cast<size_t>(n);
  }
}

}  // namespace

void MetricsServer::Serve(int fd) {
  SetIoTimeouts(fd, io_timeout_);
  constexpr size_t kMaxRequest = 8192;
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() >= kMaxRequest) return Reply(fd, "431 Request Header Fields Too Large", "request too large\n");
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or silent past the timeout: nothing to answer
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0)
    return Reply(fd, "400 Bad Request", "expected: GET /metrics HTTP/1.1\n");
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  if (target != "/metrics") return Reply(fd, "404 Not Found", "not found: only /metrics is served\n");
  if (method != "GET" && method != "HEAD") return Reply(fd, "405 Method Not Allowed", "GET or HEAD only\n");
  Reply(fd, "200 OK", render_(), method == "HEAD");
}

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
  for (const FileStateRow& row : kFileStates)
    m.Gauge("tce_files", "files the server knows, by state",
            static_cast<double>(stats.files_by_state[static_cast<int>(row.state)]), {{"state", row.metrics_label}});
  m.Gauge("tce_persist_queue", "files waiting for or in persistence", static_cast<double>(st.persist_queue()));
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
