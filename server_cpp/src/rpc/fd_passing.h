// Sending and receiving one packet with (at most) one file descriptor over a
// Unix SOCK_SEQPACKET socket (SCM_RIGHTS). Any thread.
#pragma once

#include <string>

#include "common/status.h"

namespace tce {

// Sends `data` with `fd` attached (fd < 0: none). Never blocks, never raises
// SIGPIPE: a peer that does not read is an error.
Status SendPacket(int sock, const std::string& data, int fd);
// Receives one packet of at most `max` bytes and at most one fd (-1 if none).
// A packet larger than `max` is an error; EOF gives an empty `data` and OK.
Status RecvPacket(int sock, size_t max, std::string* data, int* fd);

}  // namespace tce
