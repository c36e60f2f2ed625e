#include "common/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

namespace ddl {

namespace {

bool allDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

StatusOr<HostPort> parseHostPort(std::string_view text, int min_port) {
  auto bad = [](std::string why) { return Status::invalidArgument(std::move(why)); };
  if (text.empty()) return bad("it is empty");
  if (text.find("://") != std::string_view::npos) return bad("give HOST:PORT without a scheme");
  if (text.find_first_of(" \t\r\n/") != std::string_view::npos) return bad("it contains a space or '/'");
  std::string_view host, port;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("'[' without ']'");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty()) return bad("no port");
    if (rest.front() != ':') return bad("expected ':' after ']'");
    port = rest.substr(1);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    if (text.find(':') != colon) return bad("write an IPv6 address in brackets, as [::1]:7070");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  if (port.empty()) return bad("no port");
  if (port.size() > 5 || !allDigits(port)) return bad("port '" + std::string(port) + "' is not a number");
  const int p = std::stoi(std::string(port));
  if (p < min_port || p > 65535) {
    return bad("port " + std::to_string(p) + " is out of range " + std::to_string(min_port) + "-65535");
  }
  return HostPort{std::string(host), p};
}

std::string formatHostPort(std::string_view host, int port) {
  const bool v6 = host.find(':') != std::string_view::npos && host.front() != '[';
  return (v6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + std::to_string(port);
}

std::string hostOf(std::string_view text) {
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    return std::string(close == std::string_view::npos ? text.substr(1) : text.substr(1, close - 1));
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || text.find(':') != colon)
    return std::string(text);  // none, or bare IPv6
  return std::string(text.substr(0, colon));
}

bool isLoopback(std::string_view text) {
  const std::string host = hostOf(text);
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::vector<std::string> splitAddressList(std::string_view text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.emplace_back(
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return parts;
    start = comma + 1;
  }
}

}  // namespace ddl
