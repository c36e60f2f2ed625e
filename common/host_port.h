// "HOST:PORT" addresses: the one parser and formatter of ddl's programs (the coordinator's listen and http
// settings, the agent's coordinator address, ddlctl's --coordinator, ddlrun's --root, TLS's loopback check,
// and libddl's rendezvous address, DDL_ROOT: libddl compiles this file into its own objects).
//
// Forms: "name:7070", "10.0.0.1:7070", "[fd00::1]:7070". An IPv6 address must be in brackets: "::1:7070" is
// refused rather than guessed. Threads: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ddl {

struct HostPort {
  std::string host;  // without brackets: "fd00::1"
  int port = 0;
};

// Parses `text`; ports below `min_port` (0 or 1: 0 means "any free port" to a listener) are refused. An
// error's message is the reason alone ("no port", "port 70000 is out of range 1-65535"), for the caller to
// put after what it was reading: "invalid coordinator address 'x': no port (expected HOST:PORT, ...)".
StatusOr<HostPort> parseHostPort(std::string_view text, int min_port = 0);

// "host:port", with an IPv6 address in brackets ("[fd00::1]:29500"); a host already in brackets stays so.
std::string formatHostPort(std::string_view host, int port);

// The host of "HOST:PORT", "[V6]:PORT", a bare host or a bare IPv6 address, without brackets. No checks: for
// questions about the host alone (is it loopback?) on text that may not have been parsed yet.
std::string hostOf(std::string_view text);

// Whether hostOf(text) is "localhost", an address in 127.0.0.0/8 or ::1: where plaintext (--insecure) and an
// open dashboard are allowed. A name other than localhost is not loopback, whatever it resolves to.
bool isLoopback(std::string_view text);

// A list of addresses, "a:1,b:2" (several coordinators that share an etcd store: clients try them in turn);
// the parts as written, empty ones included, so that a checker can name them. One part for text without a
// comma.
std::vector<std::string> splitAddressList(std::string_view text);

}  // namespace ddl
