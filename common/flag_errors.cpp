// Command-line mistakes said for a person: see flag_errors.h.
#include "common/flag_errors.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace ddl {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string nearestWord(const std::string& given, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = given.size() <= 4 ? 2 : 3;
  for (const std::string& c : candidates) {
    size_t distance = editDistance(given, c);
    if (given.size() >= 3 && c.rfind(given, 0) == 0) distance = std::min<size_t>(distance, 2);
    if (distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

std::vector<std::string> longFlagNames(const CLI::App& scope) {
  std::vector<std::string> names;
  for (const CLI::App* app = &scope; app != nullptr; app = app->get_parent()) {
    for (const CLI::Option* option : app->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    }
  }
  return names;
}

const CLI::App& innermostSubcommand(const CLI::App& app) {
  const CLI::App* at = &app;
  for (int depth = 0; depth < 8 && !at->get_subcommands().empty(); ++depth)
    at = at->get_subcommands().front();
  return *at;
}

std::string describeFlagError(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App& scope = innermostSubcommand(app);
  const std::string of = &scope != &app ? " for " + scope.get_name() : "";
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras;
    for (const CLI::App* at = &scope; at != nullptr; at = at->get_parent()) {
      for (const std::string& w : at->remaining()) extras.push_back(w);
    }
    for (const std::string& word : extras) {
      if (word.size() > 1 && word[0] == '-') {
        const std::string name = word.substr(0, word.find('='));
        const std::string guess = nearestWord(name, longFlagNames(scope));
        return "unknown option " + name + of + (guess.empty() ? "" : "; did you mean " + guess + "?");
      }
    }
    if (!extras.empty()) return "unexpected argument '" + extras.front() + "'" + of;
  }
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // "Could not convert: --port = two"
    const size_t colon = what.find(": "), equals = what.find(" = ");
    if (colon != std::string::npos && equals != std::string::npos && equals > colon)
      return what.substr(colon + 2, equals - colon - 2) + " takes a number, got '" + what.substr(equals + 3) +
             "'";
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // "--node: 1 required TEXT missing"
    const size_t colon = what.find(": ");
    if (colon != std::string::npos && what.find("missing") != std::string::npos)
      return what.substr(0, colon) + " needs a value";
  }
  return what;
}

int parseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help, --version
      app.exit(e, std::cout, std::cerr);
      return 0;
    }
    const CLI::App& scope = innermostSubcommand(app);
    const std::string program =
        argc > 0 ? std::filesystem::path(argv[0]).filename().string() : app.get_name();
    std::string help = program;
    if (&scope != &app) help += " " + scope.get_name();
    std::cerr << program << ": " << describeFlagError(app, e) << "\n"
              << "see '" << help << " --help' for the flags\n";
    return 2;
  }
  return -1;
}

}  // namespace ddl
