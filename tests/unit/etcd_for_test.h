// An etcd server for a test: one member on loopback ports chosen at run time, its data in a directory of its
// own, stopped (SIGKILL) and removed with the object. The binary is the one scripts/bootstrap unpacks into
// .cache/etcd (DDL_ETCD_BINARY), else `etcd` on PATH; without either, start() says why and tests skip.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace ddl::test_util {

class EtcdForTest {
 public:
  EtcdForTest() = default;
  EtcdForTest(const EtcdForTest&) = delete;
  EtcdForTest& operator=(const EtcdForTest&) = delete;
  ~EtcdForTest() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // The etcd binary, or "" when there is none.
  static std::string binary() {
#ifdef DDL_ETCD_BINARY
    if (::access(DDL_ETCD_BINARY, X_OK) == 0) return DDL_ETCD_BINARY;
#endif
    for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
      const std::string path = std::string(dir) + "/etcd";
      if (::access(path.c_str(), X_OK) == 0) return path;
    }
    return "";
  }

  // Starts the member; "" or why not. The caller waits until it answers (EtcdStore::open in a bounded loop).
  std::string start() {
    const std::string etcd = binary();
    if (etcd.empty()) return "no etcd binary (scripts/bootstrap unpacks one into .cache/etcd)";
    char tmpl[] = "/tmp/ddl-etcd-XXXXXX";
    if (!::mkdtemp(tmpl)) return "cannot make a temporary directory";
    dir_ = tmpl;
    client_port_ = freePort();
    const int peer_port = freePort();
    if (client_port_ <= 0 || peer_port <= 0) return "no free loopback port";
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    std::vector<std::string> args = {etcd,
                                     "--name",
                                     "m0",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "m0=" + peer,
                                     "--logger",
                                     "zap",
                                     "--log-outputs",
                                     dir_ + "/etcd.log"};
    pid_ = ::fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return "";
  }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

 private:
  static int freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    return port;
  }

  std::string dir_;
  pid_t pid_ = -1;
  int client_port_ = 0;
};

}  // namespace ddl::test_util
