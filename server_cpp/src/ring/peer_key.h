// PeerKey: what a server proves who it is with when it talks to its ring
// peers. The cluster token (every server of the cluster knows it) proves
// membership of the cluster; where the operator gives each node a
// certificate of its own, signed by the cluster's CA, the certificate proves
// which node a peer is, something a token holder cannot claim for a node it
// is not, even from that node's address.
//
// Certificates authenticate the handshake only (PeerLink signs it with the
// node's key; the peer checks the signature, the certificate's chain to the
// CA and that the certificate names the host of the endpoint the peer
// announced). The data path stays as it is (see docs/ring.md for why not
// TLS): a proven connection carries checkpoint bytes at link speed.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace tce {

// A node's certificate and private key, and the CA its peers' certificates
// must chain to. Immutable once loaded; thread-safe.
class NodeCert {
 public:
  ~NodeCert();
  NodeCert(const NodeCert&) = delete;
  NodeCert& operator=(const NodeCert&) = delete;

  // Loads PEM files: this node's certificate, its private key and the CA
  // certificate(s). INVALID_ARGUMENT naming the file and the reason when one
  // cannot be read or parsed, the key is not the certificate's, or the
  // certificate does not chain to the CA.
  static Status Load(const std::string& cert_file, const std::string& key_file, const std::string& ca_file,
                     std::shared_ptr<const NodeCert>* out);

  // This node's certificate, DER-encoded (what the handshake sends).
  const std::string& der() const { return der_; }
  // A signature of `data` with this node's key (SHA-256; Ed25519 signs `data` itself).
  Status Sign(const std::string& data, std::string* signature) const;
  // OK when `der` is a certificate that chains to the CA, is valid now, names
  // `host` (an IP address: an IP SAN; a name: a DNS SAN), and whose key made
  // `signature` of `data`. UNAUTHENTICATED saying which check failed.
  Status Verify(const std::string& der, const std::string& host, const std::string& data,
                const std::string& signature) const;

 private:
  struct Keys;
  explicit NodeCert(std::unique_ptr<Keys> keys, std::string der);
  std::unique_ptr<Keys> keys_;
  std::string der_;
};

// The token, and this node's certificate where the operator gave one. A
// token alone converts implicitly (tests, and rings without certificates).
struct PeerKey {
  PeerKey() = default;
  PeerKey(std::string t) : token(std::move(t)) {}  // NOLINT: implicit on purpose
  PeerKey(const char* t) : token(t) {}             // NOLINT
  std::string token;
  std::shared_ptr<const NodeCert> cert;  // null: the token alone
};

}  // namespace tce
