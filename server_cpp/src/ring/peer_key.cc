#include "ring/peer_key.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>

namespace tce {

struct NodeCert::Keys {
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  X509_STORE* ca = nullptr;
  ~Keys() {
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_STORE_free(ca);
  }
};

namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no reason given";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// Reads one PEM object from `path` with `read` (PEM_read_X509, ...).
template <typename T, typename Read>
Status ReadPem(const std::string& path, const char* what, Read read, T** out) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return Status::InvalidArgument(std::string(what) + ": cannot open " + path);
  *out = read(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!*out) return Status::InvalidArgument(std::string(what) + ": " + path + " holds no PEM " + what + " (" +
                                            OpenSslError() + ")");
  return Status::OK();
}

// OK when `cert` chains to a certificate of `ca` and is valid now.
Status ChainsTo(X509_STORE* ca, X509* cert) {
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  if (!ctx) return Status::Internal("no memory to check a certificate");
  int ok = X509_STORE_CTX_init(ctx, ca, cert, nullptr);
  if (ok == 1) ok = X509_verify_cert(ctx);
  const int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  ERR_clear_error();
  if (ok == 1) return Status::OK();
  return Status::Unauthenticated(std::string("its certificate does not chain to the cluster CA: ") +
                                 X509_verify_cert_error_string(err));
}

bool IsIpLiteral(const std::string& host) {
  unsigned char addr[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), addr) == 1 || inet_pton(AF_INET6, host.c_str(), addr) == 1;
}

// Ed25519 and Ed448 sign the message itself; the others a SHA-256 digest.
const EVP_MD* DigestFor(EVP_PKEY* key) {
  const int id = EVP_PKEY_get_base_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

}  // namespace

NodeCert::NodeCert(std::unique_ptr<Keys> keys, std::string der) : keys_(std::move(keys)), der_(std::move(der)) {}

NodeCert::~NodeCert() = default;

Status NodeCert::Load(const std::string& cert_file, const std::string& key_file, const std::string& ca_file,
                      std::shared_ptr<const NodeCert>* out) {
  auto keys = std::make_unique<Keys>();
  Status s = ReadPem(cert_file, "certificate", PEM_read_X509, &keys->cert);
  if (s.ok()) s = ReadPem(key_file, "private key", PEM_read_PrivateKey, &keys->key);
  if (!s.ok()) return s;
  keys->ca = X509_STORE_new();
  if (!keys->ca || X509_STORE_load_file(keys->ca, ca_file.c_str()) != 1)
    return Status::InvalidArgument("peer_ca_file: " + ca_file + " holds no PEM CA certificate (" + OpenSslError() +
                                   ")");
  if (X509_check_private_key(keys->cert, keys->key) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("peer_key_file: " + key_file + " is not the key of the certificate in " +
                                   cert_file);
  }
  s = ChainsTo(keys->ca, keys->cert);
  if (!s.ok()) return Status::InvalidArgument("peer_cert_file: " + cert_file + ": " + s.message());
  const int n = i2d_X509(keys->cert, nullptr);
  if (n <= 0) return Status::InvalidArgument("peer_cert_file: " + cert_file + " cannot be encoded");
  std::string der(static_cast<size_t>(n), '\0');
  unsigned char* p = reinterpret_cast<unsigned char*>(&der[0]);
  i2d_X509(keys->cert, &p);
  out->reset(new NodeCert(std::move(keys), std::move(der)));
  return Status::OK();
}

Status NodeCert::Sign(const std::string& data, std::string* signature) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) return Status::Internal("no memory to sign");
  size_t len = 0;
  const auto* in = reinterpret_cast<const unsigned char*>(data.data());
  bool ok = EVP_DigestSignInit(ctx, nullptr, DigestFor(keys_->key), nullptr, keys_->key) == 1 &&
            EVP_DigestSign(ctx, nullptr, &len, in, data.size()) == 1;
  if (ok) {
    signature->assign(len, '\0');
    ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(&(*signature)[0]), &len, in, data.size()) == 1;
    signature->resize(len);
  }
  EVP_MD_CTX_free(ctx);
  if (!ok) return Status::Internal("cannot sign with the node's key: " + OpenSslError());
  return Status::OK();
}

Status NodeCert::Verify(const std::string& der, const std::string& host, const std::string& data,
                        const std::string& signature) const {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  X509* cert = d2i_X509(nullptr, &p, static_cast<long>(der.size()));
  if (!cert || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    X509_free(cert);
    ERR_clear_error();
    return Status::Unauthenticated("it sent no certificate (or bytes after one)");
  }
  Status s = ChainsTo(keys_->ca, cert);
  if (s.ok()) {
    const int named = IsIpLiteral(host) ? X509_check_ip_asc(cert, host.c_str(), 0)
                                        : X509_check_host(cert, host.data(), host.size(), 0, nullptr);
    if (named != 1) s = Status::Unauthenticated("its certificate does not name " + host);
  }
  if (s.ok()) {
    EVP_PKEY* key = X509_get0_pubkey(cert);
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    const bool ok = key && ctx && EVP_DigestVerifyInit(ctx, nullptr, DigestFor(key), nullptr, key) == 1 &&
                    EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                                     reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
    EVP_MD_CTX_free(ctx);
    if (!ok) s = Status::Unauthenticated("its signature of this handshake is not its certificate's");
  }
  X509_free(cert);
  ERR_clear_error();
  return s;
}

}  // namespace tce
