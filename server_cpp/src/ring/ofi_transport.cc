// The ofi transport: libfabric RMA writes over a reliable-datagram (RDM)
// endpoint, the type every RMA provider offers (verbs and tcp through
// ofi_rxm, efa natively).
//
// One transfer: the receiver registers its buffer for remote writes, with a
// random key, and sends the registration (OfiTarget) on the authenticated
// link; the sender writes the chunks into it, several in flight, with
// delivery-complete semantics, and reports the landed prefix (OfiProgress)
// on the link; the receiver checksums each landed range and, at the end or
// on any error, closes the registration. So the buffer is writable only by
// the peer it was given to, and only while that transfer lasts.
//
// The endpoint is shared by every transfer of the server; one progress
// thread reads its completion queue (providers with manual progress, like
// tcp, also need that read for the target side to make progress) and hands
// each completion to the transfer that posted it. A transfer's state is
// reference-counted: a transfer that times out leaves it (and the mapping of
// its source) to the completions still owed to it.
#include "ring/ofi_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <openssl/rand.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "ring/fabric_info.h"
#include "ring/fabric_select.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {

constexpr int kWindow = 8;                     // writes in flight per transfer
constexpr uint64_t kProgressEvery = 16 << 20;  // report the landed prefix this often

std::string FiError(const std::string& what, int ret) {
  return what + ": " + fi_strerror(ret < 0 ? -ret : ret);
}

// One sender transfer, shared with the progress thread through its writes.
struct Transfer {
  Mutex mu;
  CondVar cv;
  int in_flight GUARDED_BY(mu) = 0;
  std::vector<bool> done GUARDED_BY(mu);  // per chunk
  std::string error GUARDED_BY(mu);  // first failed write
  void* map = MAP_FAILED;            // the source, mapped for this transfer
  uint64_t size = 0;
  fid_mr* mr = nullptr;              // the source's registration (FI_MR_LOCAL)
  ~Transfer() {
    if (mr) fi_close(&mr->fid);
    if (map != MAP_FAILED) munmap(map, size);
  }
};

struct Write {
  fi_context2 ctx;  // first: the provider's scratch space (FI_CONTEXT2 mode)
  std::shared_ptr<Transfer> transfer;
  size_t chunk = 0;
};

class OfiTransport final : public Transport {
 public:
  ~OfiTransport() override {
    stop_ = true;
    if (progress_.joinable()) progress_.join();
    if (ep_) fi_close(&ep_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
  }

  const char* name() const override { return "ofi"; }

  Status Open(const TransportOptions& o) {
    timeout_ = o.io_timeout;
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    if (!o.ofi_provider.empty()) hints->fabric_attr->prov_name = strdup(o.ofi_provider.c_str());
    fi_info* all = nullptr;
    DeviceFilter filter = ParseDeviceFilter(o.ofi_devices);
    // Without a device filter, the device that owns our peer address (so a
    // tcp provider uses the interface the ring's links use).
    const bool by_address = filter.names.empty() && !o.source_host.empty();
    int ret = fi_getinfo(FI_VERSION(1, 9), by_address ? o.source_host.c_str() : nullptr, nullptr,
                         by_address ? FI_SOURCE : 0, hints, &all);
    fi_freeinfo(hints);
    if (ret != 0 || !all)
      return Status::Unavailable(FiError("no libfabric provider offers RMA over a reliable endpoint" +
                                             std::string(o.ofi_provider.empty() ? "" : " (provider '" + o.ofi_provider + "')") +
                                             (by_address ? " on " + o.source_host : std::string()),
                                         ret ? ret : -FI_ENODATA));
    fi_info* pick = nullptr;
    std::vector<std::string> seen;
    for (fi_info* i = all; i && !pick; i = i->next) {
      if (!CarriesTheRing(i)) continue;
      seen.push_back(i->domain_attr->name);
      if (filter.Matches(i->domain_attr->name)) pick = i;
    }
    if (!pick) {
      fi_freeinfo(all);
      std::string list;
      for (const auto& d : seen) list += (list.empty() ? "" : ",") + d;
      return Status::InvalidArgument("no fabric device matches '" + o.ofi_devices + "' (devices: " + list + ")");
    }
    info_ = fi_dupinfo(pick);
    fi_freeinfo(all);
    if ((ret = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0) return Status::Unavailable(FiError("fi_fabric", ret));
    if ((ret = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) return Status::Unavailable(FiError("fi_domain", ret));
    fi_cq_attr cq_attr = {};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.size = 1024;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    if (fi_cq_open(domain_, &cq_attr, &cq_, nullptr) != 0) {  // no wait objects: poll
      cq_attr.wait_obj = FI_WAIT_NONE;
      waitable_ = false;
      if ((ret = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) return Status::Unavailable(FiError("fi_cq_open", ret));
    }
    fi_av_attr av_attr = {};
    av_attr.type = FI_AV_TABLE;
    if ((ret = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0) return Status::Unavailable(FiError("fi_av_open", ret));
    if ((ret = fi_endpoint(domain_, info_, &ep_, nullptr)) != 0) return Status::Unavailable(FiError("fi_endpoint", ret));
    if ((ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) return Status::Unavailable(FiError("bind cq", ret));
    if ((ret = fi_ep_bind(ep_, &av_->fid, 0)) != 0) return Status::Unavailable(FiError("bind av", ret));
    if ((ret = fi_enable(ep_)) != 0) return Status::Unavailable(FiError("fi_enable", ret));
    char addr[256];
    size_t len = sizeof(addr);
    if ((ret = fi_getname(&ep_->fid, addr, &len)) != 0) return Status::Unavailable(FiError("fi_getname", ret));
    address_.assign(addr, len);
    chunk_ = std::min<uint64_t>(kTransferChunk, info_->ep_attr->max_msg_size ? info_->ep_attr->max_msg_size : kTransferChunk);
    progress_ = std::thread([this] { Progress(); });
    TCE_LOG(kInfo, "ring") << "ofi transport: provider " << info_->fabric_attr->prov_name << ", fabric "
                           << info_->fabric_attr->name << ", device " << info_->domain_attr->name
                           << ", mr_mode 0x" << std::hex << info_->domain_attr->mr_mode << std::dec
                           << (waitable_ ? "" : ", polled completions");
    return Status::OK();
  }

  Status Send(PeerLink* link, const SendSource& src, const ChunkFn& before) override {
    if (src.size == 0) return Status::OK();
    v1::OfiTarget target;
    Status s = link->Recv(&target);
    if (!s.ok()) return s;
    if (target.code() != 0)
      return Status::FromCode(static_cast<Status::Code>(target.code()), "peer " + link->peer() + ": " + target.message());
    if (target.size() != src.size)
      return Status::InvalidArgument("peer " + link->peer() + " registered " + std::to_string(target.size()) +
                                     " bytes for a " + std::to_string(src.size) + "-byte transfer");
    fi_addr_t dest = FI_ADDR_UNSPEC;  // set by Resolve
    if (!(s = Resolve(target.address(), &dest)).ok()) return Fail(link, s);
    auto t = std::make_shared<Transfer>();
    t->size = src.size;
    t->map = mmap(nullptr, src.size, PROT_READ, MAP_SHARED | MAP_POPULATE, src.fd, 0);
    if (t->map == MAP_FAILED) return Fail(link, Status::FromErrno(errno, "mmap backup source"));
    const auto* data = static_cast<const unsigned char*>(t->map);
    void* desc = nullptr;
    if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
      int ret = fi_mr_reg(domain_, data, src.size, FI_WRITE, 0, 0, 0, &t->mr, nullptr);
      if (ret != 0) return Fail(link, Status::Unavailable(FiError("register the source", ret)));
      desc = fi_mr_desc(t->mr);
    }
    const size_t chunks = static_cast<size_t>((src.size + chunk_ - 1) / chunk_);
    size_t posted = 0, landed_chunks = 0;
    uint64_t reported = 0;
    MutexLock l(&t->mu);
    t->done.assign(chunks, false);
    while (landed_chunks < chunks) {
      while (posted < chunks && t->in_flight < kWindow && t->error.empty()) {
        const uint64_t off = posted * chunk_, n = std::min<uint64_t>(chunk_, src.size - off);
        l.Unlock();
        if (before) before(off, n);
        auto* w = new Write{};
        w->transfer = t;
        w->chunk = posted;
        int ret;
        const auto deadline = clock_->Now() + timeout_;
        while ((ret = static_cast<int>(fi_write(ep_, data + off, n, desc, dest, target.base() + off,
                                                target.key(), &w->ctx))) == -FI_EAGAIN &&
               clock_->Now() < deadline)
          clock_->SleepFor(std::chrono::microseconds(50));  // queue full: the progress thread drains it
        l.Lock();
        if (ret != 0) {
          delete w;
          if (t->error.empty()) t->error = FiError("fi_write", ret);
          break;
        }
        ++t->in_flight;
        ++posted;
      }
      if (!t->error.empty()) break;
      const auto wait_until = clock_->Now() + timeout_;
      while (t->error.empty() && !t->done[landed_chunks] && clock_->WaitUntil(&t->cv, &t->mu, wait_until)) {
      }
      if (t->error.empty() && !t->done[landed_chunks]) {
        t->error = "no write completed in " + std::to_string(timeout_.count()) + "ms";
        break;
      }
      while (landed_chunks < chunks && t->done[landed_chunks]) ++landed_chunks;
      const uint64_t landed = std::min<uint64_t>(landed_chunks * chunk_, src.size);
      if (landed - reported >= kProgressEvery || landed == src.size) {
        l.Unlock();
        v1::OfiProgress p;
        p.set_landed(landed);
        s = link->Send(p);
        l.Lock();
        if (!s.ok()) return s;
        reported = landed;
      }
    }
    if (!t->error.empty()) {
      // In-flight writes keep `t` (and the mapping) alive until they complete.
      std::string error = t->error;
      l.Unlock();
      return Fail(link, Status::Unavailable("RMA write to " + link->peer() + ": " + error));
    }
    return Status::OK();
  }

  Status Recv(PeerLink* link, const RecvDest& into, uint64_t size, const LandedFn& landed) override {
    if (size == 0) return Status::OK();
    unsigned char* const dst = into.map;  // the peer writes the mapping
    fid_mr* mr = nullptr;
    uint64_t key = 0;  // ignored by providers that choose their own (FI_MR_PROV_KEY)
    // The key guards the buffer: from the CSPRNG, as the handshake's nonces.
    int ret = RAND_bytes(reinterpret_cast<unsigned char*>(&key), sizeof(key)) == 1
                  ? fi_mr_reg(domain_, dst, size, FI_REMOTE_WRITE, 0, key, 0, &mr, nullptr)
                  : -FI_EOTHER;
    v1::OfiTarget target;
    if (ret != 0) {
      Status why = Status::Unavailable(FiError("register the receive buffer", ret));
      target.set_code(static_cast<int>(why.code()));
      target.set_message(why.message());
      Status s = link->Send(target);
      return s.ok() ? why : s;
    }
    target.set_address(address_);
    target.set_base((info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(dst) : 0);
    target.set_key(fi_mr_key(mr));
    target.set_size(size);
    Status s = link->Send(target);
    uint64_t have = 0;
    while (s.ok() && have < size) {
      v1::OfiProgress p;
      s = link->Recv(&p);
      if (!s.ok()) break;
      if (p.code() != 0) {
        s = Status::Unavailable("peer " + link->peer() + ": " + p.message());
        break;
      }
      if (p.landed() < have || p.landed() > size) {
        s = Status::Unavailable("peer " + link->peer() + " reported " + std::to_string(p.landed()) +
                                " bytes landed of " + std::to_string(size));
        break;
      }
      for (uint64_t off = have; landed && off < p.landed(); off += kTransferChunk)
        landed(off, std::min(kTransferChunk, p.landed() - off), dst + off);
      have = p.landed();
    }
    fi_close(&mr->fid);  // the peer can no longer write here
    return s;
  }

  Status Refuse(PeerLink* link, uint64_t size, const Status& why) override {
    if (size == 0) return Status::OK();
    v1::OfiTarget target;
    target.set_code(static_cast<int>(why.code()));
    target.set_message(why.message());
    Status s = link->Send(target);
    return s.ok() ? why : s;
  }

 private:
  // Tells the receiver the transfer failed (best effort) and returns `s`.
  Status Fail(PeerLink* link, const Status& s) {
    v1::OfiProgress p;
    p.set_code(static_cast<int>(Status::Code::kUnavailable));
    p.set_message(s.message());
    Status ignored = link->Send(p);
    (void)ignored;
    return s;
  }

  Status Resolve(const std::string& address, fi_addr_t* out) {
    MutexLock l(&av_mu_);
    auto it = peers_.find(address);
    if (it != peers_.end()) {
      *out = it->second;
      return Status::OK();
    }
    fi_addr_t a = FI_ADDR_UNSPEC;
    int ret = fi_av_insert(av_, address.data(), 1, &a, 0, nullptr);
    if (ret != 1) return Status::Unavailable(FiError("fi_av_insert", ret < 0 ? ret : -FI_EINVAL));
    peers_[address] = a;
    *out = a;
    return Status::OK();
  }

  void Complete(void* context, const std::string& error) {
    auto* w = static_cast<Write*>(context);
    std::shared_ptr<Transfer> t = std::move(w->transfer);
    const size_t chunk = w->chunk;
    delete w;
    {
      MutexLock l(&t->mu);
      --t->in_flight;
      if (error.empty()) t->done[chunk] = true;
      else if (t->error.empty()) t->error = error;
    }
    t->cv.SignalAll();
  }

  void Progress() {
    fi_cq_entry entries[32];
    while (!stop_) {
      ssize_t n = waitable_ ? fi_cq_sread(cq_, entries, 32, nullptr, 100) : fi_cq_read(cq_, entries, 32);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) Complete(entries[i].op_context, "");
      } else if (n == -FI_EAVAIL) {
        fi_cq_err_entry err = {};
        if (fi_cq_readerr(cq_, &err, 0) > 0 && err.op_context)
          Complete(err.op_context, fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0));
      } else if (!waitable_ || (n != -FI_EAGAIN && n != -FI_ETIMEDOUT)) {
        clock_->SleepFor(std::chrono::microseconds(20));
      }
    }
  }

  Clock* const clock_ = Clock::Real();  // real time: the fabric's queues drain in it
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  bool waitable_ = true;
  std::string address_;
  uint64_t chunk_ = kTransferChunk;
  std::chrono::milliseconds timeout_{30000};
  Mutex av_mu_;
  std::map<std::string, fi_addr_t> peers_ GUARDED_BY(av_mu_);
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

}  // namespace

Status NewOfiTransport(const TransportOptions& o, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<OfiTransport>();
  Status s = t->Open(o);
  if (!s.ok()) return s;
  *out = std::move(t);
  return Status::OK();
}

}  // namespace tce
