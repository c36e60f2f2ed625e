// An etcd cluster for a test: one or more members on loopback ports chosen at run time, their data in a
// directory of their own, stopped (SIGKILL) and removed with the object. The binary is the one
// scripts/bootstrap unpacks into .cache/etcd (DDL_ETCD_BINARY), else `etcd` in /usr/bin or /usr/local/bin;
// without either, start() says why and tests skip.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace ddl::test_util {

class EtcdForTest {
 public:
  EtcdForTest() = default;
  EtcdForTest(const EtcdForTest&) = delete;
  EtcdForTest& operator=(const EtcdForTest&) = delete;
  ~EtcdForTest() {
    for (size_t i = 0; i < members_.size(); ++i) kill(i);
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

  // Starts a cluster of `members`; "" or why not. The caller waits until it answers (EtcdStore::open in a
  // bounded loop).
  // With tls (PEM files: etcd's server certificate and key, and the CA its clients' certificates must come
  // from), clients speak TLS and must show a certificate (--client-cert-auth); peers stay plaintext.
  struct Tls {
    std::string ca, cert, key;
  };
  std::string start(int members = 1, const Tls& tls = {}) {
    const std::string etcd = binary();
    if (etcd.empty()) return "no etcd binary (scripts/bootstrap unpacks one into .cache/etcd)";
    char tmpl[] = "/tmp/ddl-etcd-XXXXXX";
    if (!::mkdtemp(tmpl)) return "cannot make a temporary directory";
    dir_ = tmpl;
    std::string cluster;
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = freePort();
      m.peer_port = freePort();
      if (m.client_port <= 0 || m.peer_port <= 0) return "no free loopback port";
      cluster += (i ? "," : "") + m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
      members_.push_back(m);
    }
    for (Member& m : members_) {
      const std::string client =
          (tls.ca.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") + std::to_string(m.client_port);
      const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
      std::vector<std::string> args = {etcd,
                                       "--name",
                                       m.name,
                                       "--data-dir",
                                       dir_ + "/" + m.name,
                                       "--listen-client-urls",
                                       client,
                                       "--advertise-client-urls",
                                       client,
                                       "--listen-peer-urls",
                                       peer,
                                       "--initial-advertise-peer-urls",
                                       peer,
                                       "--initial-cluster",
                                       cluster,
                                       "--initial-cluster-state",
                                       "new",
                                       "--logger",
                                       "zap",
                                       "--log-outputs",
                                       dir_ + "/" + m.name + ".log"};
      if (!tls.ca.empty()) {
        for (const char* a : {"--cert-file", tls.cert.c_str(), "--key-file", tls.key.c_str(),
                              "--trusted-ca-file", tls.ca.c_str(), "--client-cert-auth"}) {
          args.push_back(a);
        }
      }
      m.args = args;
      if (std::string why = launch(m); !why.empty()) return why;
    }
    return "";
  }

  // Starts member i again after kill(i): it rejoins the cluster from its data directory.
  std::string restart(size_t i) {
    if (members_[i].pid > 0) return "";
    return launch(members_[i]);
  }
  bool running(size_t i) const { return members_[i].pid > 0; }
  pid_t pid(size_t i) const { return members_[i].pid; }
  size_t size() const { return members_.size(); }

  // A loopback TCP port free at the time of the call (another process may take it before it is used).
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

  // Member i's client address, and all of them.
  std::string endpoint(size_t i = 0) const { return "127.0.0.1:" + std::to_string(members_[i].client_port); }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  // kill -9 of member i.
  void kill(size_t i) {
    if (members_[i].pid > 0) {
      ::kill(members_[i].pid, SIGKILL);
      ::waitpid(members_[i].pid, nullptr, 0);
      members_[i].pid = -1;
    }
  }

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
    std::vector<std::string> args;
  };

  static std::string launch(Member& m) {
    m.pid = ::fork();
    if (m.pid < 0) return "fork failed";
    if (m.pid == 0) {
      std::vector<char*> argv;
      for (auto& a : m.args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return "";
  }

  std::string dir_;
  std::vector<Member> members_;
};

}  // namespace ddl::test_util
