#pragma once
// A TCP port on 127.0.0.1 that nobody listens on now (the kernel's pick for a socket bound
// to port 0): the rendezvous port of workers that tests run as threads.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace kiln::testing {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    ADD_FAILURE() << "no free port on 127.0.0.1";
  if (fd >= 0) ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace kiln::testing
