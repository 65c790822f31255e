// TestHttpServer: a loopback HTTP/1.1 server for the S3 client's tests. It
// records every request and answers each as the test's handler says: any
// status, headers and body, or no answer at all (a hung server, a dropped
// connection). Plain sockets, a thread per connection, bounded (64 KiB of
// headers, 64 MiB of body, 64 connections). Test code only.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace tce {

struct SeenRequest {
  std::string method, target, path, query;  // target: path?query, as sent
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case, in order
  std::string body;
  int connection = 0;  // which connection carried it (1, 2, ...)

  // The first header `name` (lower case), "" when absent.
  std::string Header(const std::string& name) const;
  bool Has(const std::string& name) const;
};

struct Answer {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool hang = false;  // never answer (until the server stops)
  bool drop = false;  // close the connection without answering
  // Content-Length to claim instead of the body's (a body cut short).
  long long claim_length = -1;

  static Answer Xml(int status, std::string body) {
    Answer a;
    a.status = status;
    a.body = std::move(body);
    a.headers.emplace_back("Content-Type", "application/xml");
    return a;
  }
  // An S3 error document.
  static Answer Error(int status, const std::string& code, const std::string& message = "msg") {
    return Xml(status, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code + "</Code><Message>" +
                           message + "</Message><RequestId>r</RequestId></Error>");
  }
};

class TestHttpServer {
 public:
  // Handlers run one at a time (tests keep plain state in them).
  using Handler = std::function<Answer(const SeenRequest&)>;

  // Listens on address:port (0: any free port). ok() is false when it cannot.
  explicit TestHttpServer(Handler handler, const std::string& address = "127.0.0.1", int port = 0);
  ~TestHttpServer();

  bool ok() const { return listen_fd_ >= 0; }
  int port() const { return port_; }
  std::string endpoint() const { return "http://" + address_ + ":" + std::to_string(port_); }

  std::vector<SeenRequest> requests() EXCLUDES(mu_);
  size_t request_count() EXCLUDES(mu_);
  int connections() EXCLUDES(mu_);
  // Waits (a bounded while, against hangs) until `n` requests came; false if they did not.
  bool WaitForRequests(size_t n) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  void AcceptLoop();
  void Serve(int fd, int connection);
  Answer Handle(SeenRequest req) EXCLUDES(mu_);
  void WaitForStop() EXCLUDES(mu_);
  bool stopping() EXCLUDES(mu_);

  const Handler handler_;
  const std::string address_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  Mutex handler_mu_;  // held while the handler runs
  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<SeenRequest> requests_ GUARDED_BY(mu_);
  std::vector<int> fds_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int connections_ GUARDED_BY(mu_) = 0;
};

}  // namespace tce
