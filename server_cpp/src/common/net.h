// TCP endpoints ("host:port", IPv4 or IPv6, "[v6]:port" accepted): parsing,
// resolving, listening. Used by the ring's peer links and the daemon's
// operational endpoints (metrics, health).
#pragma once

#include <netdb.h>

#include <chrono>
#include <string>

#include "common/status.h"

namespace tce {

// "host:port" -> host (brackets stripped) and port; a clear error otherwise.
Status ParseEndpoint(const std::string& endpoint, std::string* host, int* port);

// getaddrinfo for a stream socket; `passive`: for bind (an empty host is any).
// The caller frees *out with freeaddrinfo.
Status ResolveEndpoint(const std::string& endpoint, bool passive, addrinfo** out);

// A listening TCP socket on "host:port" (port 0: any; *bound gets the real one).
Status ListenTcp(const std::string& endpoint, int* fd, std::string* bound);

// OK when the connection `fd` comes from an address `endpoint`'s host
// names (an IP literal, or a name that resolves to it); PERMISSION_DENIED
// naming both otherwise.
Status CheckPeerSource(int fd, const std::string& endpoint);

// Binds the unconnected socket `fd` (of `family`) to `self`'s host when it
// is an IP literal of this node (port 0), so that a connection comes from
// the address this node advertises. Nothing otherwise.
void BindSource(int fd, int family, const std::string& self);

// `endpoint` with its port replaced by `port`.
std::string WithPort(const std::string& endpoint, int port);

// Sends and receives on `fd` fail after `timeout` of silence.
void SetIoTimeouts(int fd, std::chrono::milliseconds timeout);

}  // namespace tce
