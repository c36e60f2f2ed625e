// A TCP port that no socket on this host holds now: the kernel's pick for port 0, bound and closed again.
// Another process may take it before the caller binds it; the window is short. Shared by ddlrun (DDL_ROOT's
// port) and ddl-bench --tune (each candidate's rendezvous).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ddl::tools {

// address: INADDR_LOOPBACK, INADDR_ANY... (host byte order). The port, or -1 and *error says why.
inline int findFreePort(in_addr_t address, std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(address);
  socklen_t length = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) != 0) {
    *error = std::strerror(errno);
  } else {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace ddl::tools
