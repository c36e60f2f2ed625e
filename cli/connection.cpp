// How ddlctl reaches the coordinator, and what it says when that fails. The credentials come from flags, the
// environment or the user's files (findCredentials); Session holds the one channel a runDdlctl() call makes,
// lazily, so that a verb's own checks come before a missing CA certificate is reported; every failed RPC
// becomes an exit status, a message and perhaps a hint (describeRpcError), the contract scripts rely on.
// The verbs that wait ride out a coordinator restart here (Session::callRidingOut), repeating reads only; a
// submit, which carries a request id, is repeated too (Session::callIdempotent).
#include <grpcpp/grpcpp.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "common/pki.h"
#include "common/status.h"
#include "ddl/tls.h"
#include "ddlctl_internal.h"

namespace ddl::cli {

namespace {

// A TLS handshake that failed: it fails the same way on every try.
bool isTlsFailure(const std::string& message) {
  const std::string m = upper(message);
  return m.find("HANDSHAKE") != std::string::npos || m.find("SSL") != std::string::npos ||
         m.find("CERTIFICATE") != std::string::npos;
}

// A handshake that did not finish in time: a coordinator starting, stopping or stopped, not a wrong CA.
bool isTlsTimeout(const std::string& message) {
  const std::string m = upper(message);
  return m.find("HANDSHAKE") != std::string::npos &&
         (m.find("TIMED OUT") != std::string::npos || m.find("TIMEOUT") != std::string::npos ||
          m.find("DEADLINE") != std::string::npos);
}

// The outage as stderr tells it.
std::string describeOutage(const grpc::Status& status, const std::string& address, double timeoutS) {
  if (status.error_code() == grpc::StatusCode::CANCELLED)
    return "it ended the call, as a coordinator that is shutting down (a restart, an upgrade, a new leader) "
           "does";
  return describeRpcError(status.error_code(), status.error_message(), address, timeoutS).message;
}

}  // namespace

// A failure that a restarting coordinator gives, which the verbs that wait ride out: no answer (UNAVAILABLE,
// DEADLINE_EXCEEDED), or the call cut by a coordinator shutting down (SIGTERM, an upgrade, an etcd leader
// handing over), which gRPC reports as CANCELLED: ddlctl never cancels a call of its own. A handshake that
// timed out is one too (a coordinator going or coming); any other TLS failure fails the same way each time.
bool outage(const grpc::Status& status) {
  const grpc::StatusCode code = status.error_code();
  if (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED &&
      code != grpc::StatusCode::CANCELLED)
    return false;
  if (isStoreRefusal(status)) return false;  // an answer: not now, and nothing was done
  return !isTlsFailure(status.error_message()) || isTlsTimeout(status.error_message());
}

bool isStoreRefusal(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         status.error_message().find(kCannotStoreState) != std::string::npos;
}

// No connection could be made, so the call never left: the coordinator did nothing.
bool neverSent(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string m = upper(status.error_message());
  return m.find("FAILED TO CONNECT") != std::string::npos ||
         m.find("CONNECTION REFUSED") != std::string::npos || m.find("DNS RESOLUTION") != std::string::npos;
}

bool isTransportFailure(const std::string& message) {
  const std::string m = upper(message);
  for (const char* sign :
       {"FAILED TO CONNECT", "CONNECTION REFUSED", "SOCKET CLOSED", "CONNECTION RESET", "DNS RESOLUTION",
        "BROKEN PIPE", "TRANSPORT", "CONNECTIONS TO ALL BACKENDS", "GOAWAY", "ENDPOINT", "HANDSHAKE", "SSL",
        "CERTIFICATE", "CONNECTION CLOSED", "EOF", "SHUTTING DOWN", "GOING DOWN"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return m.empty() || m == "UNAVAILABLE";
}

RpcError describeRpcError(grpc::StatusCode code, const std::string& message, const std::string& address,
                          double timeoutS, bool insecure) {
  if (code == grpc::StatusCode::UNAVAILABLE && !isTransportFailure(message)) {
    // The coordinator answered: it is running, but could not do it (its disk is full, its store failed).
    return {kExitUnreachable, "the coordinator at " + address + " is running but could not do it: " + message,
            "see its log (journalctl -u ddl-coordinator): a full disk or an unwritable data dir stops every "
            "change"};
  }
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::string why;
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      why = "no answer within " + formatSeconds(timeoutS) + " s";
    } else if (upper(message).find("CONNECTION REFUSED") != std::string::npos) {
      why = "connection refused";  // gRPC's text buries this under "failed to connect to all addresses; ..."
    } else {
      why = message.empty() ? "unavailable" : message;
    }
    const std::string lower = upper(message);
    if (isTlsFailure(message)) {
      return {kExitUnreachable,
              "cannot reach coordinator at " + address + ": the TLS handshake failed (" + why + ")",
              "give the cluster's CA with --ca or DDL_CA; a coordinator run with --insecure needs --insecure "
              "here"};
    }
    if (insecure &&
        (lower.find("SOCKET CLOSED") != std::string::npos ||
         lower.find("CONNECTION RESET") != std::string::npos ||
         lower.find("CONNECTION CLOSED") != std::string::npos || lower.find("EOF") != std::string::npos)) {
      return {
          kExitUnreachable, "cannot reach coordinator at " + address + ": it closed the plaintext connection",
          "a coordinator that uses TLS (every one not started with --insecure) closes plaintext connections: "
          "drop --insecure and give its CA with --ca or DDL_CA"};
    }
    return {kExitUnreachable, "cannot reach coordinator at " + address + ": " + why,
            "is ddl-coordinator running? set --coordinator or DDL_COORDINATOR"};
  }
  if (code == grpc::StatusCode::UNAUTHENTICATED) {
    return {kExitUnauthenticated, message.empty() ? "not authenticated" : message, ""};
  }
  if (code == grpc::StatusCode::PERMISSION_DENIED) {
    return {kExitDenied, message.empty() ? "permission denied" : message, ""};
  }
  if (!message.empty()) return {kExitRefused, message, ""};
  return {kExitRefused, "the coordinator refused the request (gRPC status " + std::to_string(int(code)) + ")",
          ""};
}

std::string checkCa(const std::string& path) {
  std::string error;
  const auto pem = pki::readFile(path, &error);
  if (!pem) return "cannot read the CA certificate: " + error;
  const auto info = pki::inspectCertificate(*pem, &error);
  if (!info) return path + " is not a CA certificate (PEM): " + error;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (now > info->not_after_s) {
    return "the CA certificate " + path + " expired on " +
           formatLocalTime(info->not_after_s * 1000).substr(0, 10);
  }
  if (now < info->not_before_s) {
    return "the CA certificate " + path + " is not valid before " +
           formatLocalTime(info->not_before_s * 1000).substr(0, 10) + " (is this machine's clock right?)";
  }
  return "";
}

std::string findCredentials(const std::string& ca_flag, const std::string& token_file_flag,
                            Credentials* out) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  const char* home_env = std::getenv("HOME");
  const std::string home = home_env && *home_env ? std::string(home_env) + "/.config/ddl/" : "";
  std::error_code ec;
  out->ca = !ca_flag.empty()                                                ? ca_flag
            : !env("DDL_CA").empty()                                        ? env("DDL_CA")
            : !home.empty() && std::filesystem::exists(home + "ca.crt", ec) ? home + "ca.crt"
                                                                            : "/etc/ddl/pki/ca.crt";
  // An explicit --token-file wins, then $DDL_TOKEN, then $DDL_TOKEN_FILE, then the default file.
  std::string file = token_file_flag;
  if (file.empty()) {
    out->token = env("DDL_TOKEN");
    if (!out->token.empty()) return "";
    file = env("DDL_TOKEN_FILE");
  }
  const bool given = !file.empty();
  if (!given) file = home.empty() ? "" : home + "token";
  if (file.empty()) return "";
  std::ifstream in(file);
  if (!in) {
    // No default file: call without a token. A file the user named must be there and readable.
    return given ? "cannot read the token file " + file + ": " + std::strerror(errno) : "";
  }
  std::getline(in, out->token);
  while (!out->token.empty() && std::isspace(static_cast<unsigned char>(out->token.back())))
    out->token.pop_back();
  if (out->token.empty()) return "the token file " + file + " is empty";
  return "";
}

int Session::call(const Rpc& rpc) {
  int usage = kExitOk;
  grpc::Status status = callQuiet(rpc, &usage);
  if (usage != kExitOk) return usage;
  return report(status);
}

v1::UserService::Stub* Session::stub(size_t i, int* usage) {
  if (stubs_.empty()) stubs_.resize(addresses_.size());
  if (stubs_[i]) return stubs_[i].get();
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  if (insecure_) {
    channel_credentials = grpc::InsecureChannelCredentials();
  } else {
    std::error_code ec;
    if (!std::filesystem::exists(credentials_.ca, ec)) {
      *usage = usageError(err_, "no CA certificate at " + credentials_.ca +
                                    ": give the cluster's ca.crt with --ca or DDL_CA (--insecure for a "
                                    "development coordinator on loopback)");
      return nullptr;
    }
    // A CA file that is not a certificate, or one that expired, fails every handshake with gRPC's own log
    // lines and "unavailable": say what is wrong with it instead, before connecting.
    if (std::string why = checkCa(credentials_.ca); !why.empty()) {
      *usage = kExitUnauthenticated;
      err_ << "ddlctl: " << why << "\nhint: give the cluster's ca.crt with --ca or DDL_CA\n";
      return nullptr;
    }
    tls::addChannelArgs(&args);
    channel_credentials = tls::channelCredentials({credentials_.ca, "", ""});
  }
  // After a lost connection gRPC waits up to 2 minutes between reconnects by default: a coordinator that
  // is back after a restart would go unnoticed that long by the verbs that wait.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Its own connections: a new channel after an outage must not share the old one's (gRPC pools them per
  // process), which may be waiting out a backoff or a handshake that will never end.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  channels_.resize(addresses_.size());
  channels_[i] = grpc::CreateCustomChannel(addresses_[i], channel_credentials, args);
  stubs_[i] = v1::UserService::NewStub(channels_[i]);
  return stubs_[i].get();
}

namespace {

// Whether `channel` gets a connection (TLS included) before `deadline`; false as soon as an attempt failed
// (a standby refuses the connection) or the deadline passed (a host that is down drops the packets).
bool connects(grpc::Channel& channel, std::chrono::system_clock::time_point deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel.WaitForStateChange(state, deadline)) return false;
    state = channel.GetState(true);
  }
  return true;
}

}  // namespace

grpc::Status Session::callQuiet(const Rpc& rpc, int* usage) {
  // Several coordinators (one leads; the others hold no port open): the first, from the one that answered
  // last, that a connection can be made to gets the call. Only a connection is tried on the others, never a
  // call: one that reached a coordinator may have done its work there. None: the call goes to the one that
  // answered last, and its failure is reported.
  size_t target = current_;
  if (addresses_.size() > 1) {
    const auto each = std::chrono::milliseconds(static_cast<int64_t>(std::min(timeoutS_, 3.0) * 1000));
    for (size_t tried = 0; tried < addresses_.size(); ++tried) {
      const size_t i = (current_ + tried) % addresses_.size();
      if (!stub(i, usage))
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no usable CA certificate");
      if (connects(*channels_[i], std::chrono::system_clock::now() + each)) {  // 3 s each: a dead host's
        target = i;
        break;
      }
    }
  }
  v1::UserService::Stub* s = stub(target, usage);
  if (!s) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no usable CA certificate");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeoutS_ * 1000)));
  if (!credentials_.token.empty()) context.AddMetadata("authorization", "Bearer " + credentials_.token);
  grpc::Status status = rpc(*s, &context);
  current_ = target;
  if (status.ok()) reached_ = true;
  if (!neverSent(status)) maybeSent_ = true;
  return status;
}

grpc::Status Session::callRidingOut(const Rpc& rpc, int* usage) {
  grpc::Status status = callQuiet(rpc, usage);
  if (!reached_ || !outage(status) || reconnectS_ <= 0) return status;
  return rideOut(rpc, usage, status, "trying again");
}

grpc::Status Session::callIdempotent(const Rpc& rpc, int* usage, const std::string& again) {
  grpc::Status status = callQuiet(rpc, usage);
  // An UNAVAILABLE that is not the transport's is the coordinator's own answer (it cannot store): no outage.
  const bool answered = isStoreRefusal(status) || (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                                                   !isTransportFailure(status.error_message()));
  if (answered || !outage(status) || reconnectS_ <= 0) return status;
  if (!reached_ && neverSent(status) && addresses_.size() == 1) return status;
  return rideOut(rpc, usage, status, again);
}

grpc::Status Session::rideOut(const Rpc& rpc, int* usage, const grpc::Status& first,
                              const std::string& again) {
  grpc::Status status = first;
  const int64_t start = steadyNowMs();
  err_ << "ddlctl: lost the coordinator at " << address_ << " ("
       << escapeForTerminal(describeOutage(status, address_, timeoutS_)) << "); " << again << " for up to "
       << formatSeconds(reconnectS_) << " s (--reconnect-timeout)\n";
  err_.flush();
  // A try at least every second: back within about a second of the coordinator (or a new leader) answering.
  Pacer pacer(reconnectS_);
  while (pacer.sleep()) {
    channels_.clear();  // a fresh connection each time (see rideOut's comment)
    stubs_.clear();
    status = callQuiet(rpc, usage);
    if (!outage(status)) {
      err_ << "ddlctl: the coordinator at " << address_ << " answers again (after "
           << formatSeconds((steadyNowMs() - start) / 1000.0) << " s)\n";
      err_.flush();
      return status;
    }
  }
  return status;  // still out: the caller reports it as any failure
}

int Session::callWaiting(const Rpc& rpc) {
  int usage = kExitOk;
  grpc::Status status = callRidingOut(rpc, &usage);
  if (usage != kExitOk) return usage;
  return report(status);
}

int Session::report(const grpc::Status& status) {
  if (status.ok()) return kExitOk;
  RpcError e = describeRpcError(status.error_code(), status.error_message(), address_, timeoutS_, insecure_);
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && e.hint.empty()) {
    e.hint = "the answer was larger than gRPC allows; for list, ask for smaller pages with --page-size";
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED && e.hint.empty()) {
    e.hint = "the coordinator is older than this ddlctl; upgrade it for this verb";
  }
  err_ << "ddlctl: " << escapeForTerminal(e.message) << "\n";
  if (!e.hint.empty()) err_ << "hint: " << e.hint << "\n";
  return e.exitCode;
}

int Session::print(const google::protobuf::Message& message, const std::string& text) {
  out_ << (json_ ? toJson(message) : text);
  return kExitOk;
}
}  // namespace ddl::cli
