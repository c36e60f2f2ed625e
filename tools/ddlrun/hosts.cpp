#include "hosts.h"

#include <algorithm>
#include <sstream>

namespace ddl::launcher {

namespace {

bool validHost(const std::string& host) {
  if (host.empty() || host.size() > 253 || host[0] == '-') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':' || c == '[' || c == ']';
  });
}

bool parseSlots(const std::string& text, int* slots) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *slots = std::stoi(text);
  return *slots >= 1 && *slots <= 1024;
}

// Adds `slots` to `host` (a new entry where it was not named yet).
std::string addHost(const std::string& host, int slots, std::vector<HostSlots>* hosts) {
  if (!validHost(host)) return "ddlrun: '" + host + "' is not a host name or address";
  for (HostSlots& h : *hosts) {
    if (h.host == host) {
      h.slots = std::min(h.slots + slots, 1024);
      return "";
    }
  }
  if (hosts->size() >= static_cast<size_t>(kMaxHosts)) return "ddlrun: more than 1024 hosts";
  hosts->push_back({host, slots});
  return "";
}

// "a:4" (or "[::1]:4"), "a": the host and its slots.
std::string parseEntry(const std::string& entry, int default_slots, std::vector<HostSlots>* hosts) {
  const size_t colon = entry.rfind(':');
  const bool bracketed = !entry.empty() && entry[0] == '[';
  if (!bracketed && colon != std::string::npos && entry.find(':') != colon)
    return "ddlrun: host '" + entry + "': write an IPv6 address in brackets, as in [fe80::10]:4";
  if (colon == std::string::npos || (bracketed && colon < entry.find(']'))) {
    return addHost(entry, default_slots, hosts);
  }
  int slots = 0;
  if (!parseSlots(entry.substr(colon + 1), &slots))
    return "ddlrun: host '" + entry + "' must be HOST or HOST:SLOTS with SLOTS from 1 to 1024";
  return addHost(entry.substr(0, colon), slots, hosts);
}

}  // namespace

std::string parseHostList(const std::string& text, std::vector<HostSlots>* hosts) {
  if (text.empty()) return "ddlrun: -H needs hosts, as in -H node1:4,node2:4";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.empty()) return "ddlrun: -H '" + text + "' has an empty host; write -H node1:4,node2:4";
    if (std::string error = parseEntry(entry, 1, hosts); !error.empty()) return error;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return "";
}

std::string parseHostfile(const std::string& text, const std::string& path, std::vector<HostSlots>* hosts) {
  std::istringstream in(text);
  std::string line;
  int number = 0;
  const size_t before = hosts->size();
  while (std::getline(in, line)) {
    ++number;
    if (size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    int slots = 1;
    bool given = false;
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0 && !given && parseSlots(word.substr(6), &slots)) {
        given = true;
      } else if (word.rfind("max_slots=", 0) != 0) {  // Open MPI's max_slots: the limit, not the count
        return "ddlrun: " + path + " line " + std::to_string(number) + ": '" + word +
               "' is not slots=N (a line is HOST slots=N, HOST:N or HOST)";
      }
    }
    std::string error = given ? addHost(host, slots, hosts) : parseEntry(host, 1, hosts);
    if (!error.empty()) return error + " (" + path + " line " + std::to_string(number) + ")";
  }
  if (hosts->size() == before) return "ddlrun: " + path + " names no host";
  return "";
}

int totalSlots(const std::vector<HostSlots>& hosts) {
  int total = 0;
  for (const HostSlots& h : hosts) total += h.slots;
  return total;
}

std::vector<HostPart> planHosts(const std::vector<HostSlots>& hosts, int np) {
  std::vector<HostPart> parts;
  int next = 0;
  for (const HostSlots& h : hosts) {
    if (next >= np) break;
    const int ranks = std::min(h.slots, np - next);
    parts.push_back({h.host, next, ranks});
    next += ranks;
  }
  return parts;
}

std::string shellQuote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                              "_-./:=,+@%") == std::string::npos) {
    return text;
  }
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

}  // namespace ddl::launcher
