#include "common/signals.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <iterator>

namespace ddl {

namespace {

struct Named {
  int number;
  const char* name;
};

// Linux's standard signals (signal(7)); SIGIOT, SIGPOLL and SIGCLD are other names of these numbers.
const Named kSignals[] = {
    {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"},     {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"},
#ifdef SIGSTKFLT
    {SIGSTKFLT, "SIGSTKFLT"},
#endif
    {SIGCHLD, "SIGCHLD"},     {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},
    {SIGTTIN, "SIGTTIN"},     {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},
    {SIGXFSZ, "SIGXFSZ"},     {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"},
    {SIGIO, "SIGIO"},
#ifdef SIGPWR
    {SIGPWR, "SIGPWR"},
#endif
    {SIGSYS, "SIGSYS"},
};

}  // namespace

const char* signalAbbrev(int signal) {
  for (const Named& s : kSignals) {
    if (s.number == signal) return s.name;
  }
  return nullptr;
}

std::string signalName(int signal) {
  const char* name = signalAbbrev(signal);
  return name ? std::string(name) : "signal " + std::to_string(signal);
}

std::optional<int> signalNumber(std::string_view text) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  if (std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); })) {
    const int n = std::stoi(std::string(text));
    if (n >= 1 && n <= 64) return n;
    return std::nullopt;
  }
  std::string upper;
  for (unsigned char c : text) upper += static_cast<char>(std::toupper(c));
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  for (const Named& s : kSignals) {
    if (upper == s.name) return s.number;
  }
  return std::nullopt;
}

}  // namespace ddl
