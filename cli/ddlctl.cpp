// ddlctl: runDdlctl(), the order of work for one command line. See ddlctl.h for the contract and
// ddlctl_internal.h for where the rest lives. Order of work in runDdlctl(): split off the job command at
// "--", parse, check everything that can be checked locally (exit 2), then make the RPC (list: one per page),
// each with its own deadline. A job script (`ddlctl submit script.sh`) is read here: its #DDL lines become
// submit's flags, placed before the command line's own.
#include "ddlctl.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/host_port.h"
#include "ddl/tls.h"
#include "ddlctl_internal.h"

namespace ddl::cli {
namespace {

// `ddlctl submit script.sh ARGS`: a script starts with "#!"; its "#DDL" lines are submit flags, put before
// the command line's own so that those win (a flag given once takes the last value; --env and --label add
// up, and a later --env of the same name wins on the rank). "" or the usage error, naming the file and line.
std::string readScriptDirectives(const std::string& path, std::vector<std::string>* flags, std::ostream& out,
                                 std::ostream& err) {
  std::ifstream in(path, std::ios::binary);
  std::string head(1 << 20, '\0');  // directives come first; 1 MiB is plenty and bounds the read
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  Parsed<std::vector<Directive>> directives = parseScriptDirectives(head);
  if (!directives.ok()) return path + " " + directives.error;
  for (const Directive& d : *directives.value) {
    std::vector<std::string> words = {"ddlctl"};
    words.insert(words.end(), d.args.begin(), d.args.end());
    CommandLine scratch;
    ParseResult checked = parseWords(words, scratch, /*inSubmit=*/true, out, err);
    const std::string where = path + " line " + std::to_string(d.line) + ": ";
    if (checked.rc == kExitOk) return where + "#DDL takes submit's flags only";
    if (checked.rc != -1) return where + checked.error;
    if (!checked.rest.empty() || std::find(d.args.begin(), d.args.end(), "--") != d.args.end()) {
      return where + "#DDL takes submit's flags only, not '" + escapeForTerminal(shellJoin(d.args)) + "'";
    }
    if (scratch.submit.exportSpec != "NONE") scratch.submit.environ = processEnvironment();
    if (std::string why = checkSubmitValues(scratch.submit); !why.empty()) return where + why;
    if (!scratch.array.empty()) {
      if (Parsed<int> count = checkArraySpec(scratch.array); !count.ok()) return where + count.error;
    }
    flags->insert(flags->end(), d.args.begin(), d.args.end());
  }
  return "";
}

bool isScript(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {0, 0};
  return in.read(magic, 2) && magic[0] == '#' && magic[1] == '!';
}

// "" when the script may be run as a program, else the usage error: a script without x permission would be
// accepted and then fail on its node with 126. The hint runs it through its own #! interpreter.
std::string checkExecutable(const std::string& path) {
  if (access(path.c_str(), X_OK) == 0) return "";
  std::ifstream in(path, std::ios::binary);
  std::string shebang;
  std::getline(in, shebang);
  std::string interpreter = trim(std::string_view(shebang).substr(std::min<size_t>(2, shebang.size())));
  if (!interpreter.empty() && interpreter.back() == '\r') interpreter.pop_back();
  if (interpreter.empty()) interpreter = "/bin/sh";
  const std::string shown = escapeForTerminal(shellJoin({path}));
  return shown + " is not executable: chmod +x " + shown + ", or submit -- " +
         escapeForTerminal(interpreter) + " " + shown + " ...";
}

}  // namespace

int runDdlctl(int argc, char** argv, std::ostream& out, std::ostream& err) {
  // Everything after the first "--" is the job's command, never ddlctl's flags: a "--help" there is the
  // program's own.
  std::vector<std::string> words;
  std::vector<std::string> command;
  bool sawDashDash = false;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && !sawDashDash && std::string_view(argv[i]) == "--") {
      sawDashDash = true;
      continue;
    }
    (sawDashDash ? command : words).emplace_back(argv[i]);
  }

  CommandLine cl;
  ParseResult parsed = parseWords(words, cl, false, out, err);
  if (parsed.rc == kExitUsage) return usageError(err, parsed.error, parsed.verb);
  if (parsed.rc != -1) return parsed.rc;
  if (cl.verb == "submit" && !parsed.rest.empty()) {
    const std::string& first = parsed.rest.front();
    std::error_code missing;
    if (!sawDashDash && !std::filesystem::exists(first, missing) &&
        (first.find('/') != std::string::npos || first.find('.') != std::string::npos)) {
      // Meant as a job script, by its look (train.sh, ./run, jobs/a.sbatch): a typo, most likely.
      return usageError(err, "no such file: " + first +
                                 " (a job script must be an existing file that starts "
                                 "with #!; a command goes after --, as in: ddlctl submit --gpus 4 -- " +
                                 shellJoin(parsed.rest) + ")");
    }
    if (sawDashDash || !isScript(first)) {
      return usageError(err, "put the job's command after --, as in: ddlctl submit --gpus 4 -- " +
                                 shellJoin(parsed.rest) + " (or give a script that starts with #!)");
    }
    if (std::string why = checkExecutable(parsed.rest.front()); !why.empty()) return usageError(err, why);
    // A script: its directives go before the command line's flags, right after the verb.
    std::vector<std::string> directives;
    if (std::string why = readScriptDirectives(parsed.rest.front(), &directives, out, err); !why.empty()) {
      return usageError(err, why);
    }
    const std::vector<std::string> rest = parsed.rest;
    std::vector<std::string> flags(words.begin(), words.end() - static_cast<std::ptrdiff_t>(rest.size()));
    // The job's shape is one choice: one given on the command line replaces the script's whole.
    auto shapeFlag = [](const std::string& w) {
      const std::string name = w.substr(0, w.find('='));
      return name == "--gpus" || name == "--nodes" || name == "--gpus-per-node";
    };
    if (std::any_of(flags.begin(), flags.end(), shapeFlag)) {
      std::vector<std::string> kept;
      for (size_t i = 0; i < directives.size(); ++i) {
        if (!shapeFlag(directives[i])) {
          kept.push_back(directives[i]);
        } else if (directives[i].find('=') == std::string::npos) {
          ++i;  // its value
        }
      }
      directives = kept;
    }
    auto verbAt = std::find(flags.begin() + 1, flags.end(), "submit");
    flags.insert(verbAt + 1, directives.begin(), directives.end());
    cl = CommandLine{};
    parsed = parseWords(flags, cl, false, out, err);
    if (parsed.rc == kExitUsage) return usageError(err, parsed.error, parsed.verb);
    if (parsed.rc != -1) return parsed.rc;
    std::error_code ec;
    command = rest;
    command.front() = std::filesystem::absolute(rest.front(), ec).lexically_normal().string();
  }
  cl.submit.command = command;

  if (sawDashDash && cl.verb != "submit") return usageError(err, "only submit takes a command after --");
  // Checked here, not with CLI::PositiveNumber, whose message prints the largest double in full.
  if (!(cl.timeoutS > 0 && cl.timeoutS <= 86400 * 365)) {
    return usageError(err,
                      "--timeout must be a positive number of seconds, got " + formatSeconds(cl.timeoutS));
  }
  std::string from;
  if (cl.coordinator.empty()) {
    const char* env = std::getenv("DDL_COORDINATOR");
    cl.coordinator = env != nullptr && *env ? env : kDefaultCoordinator;
    if (env != nullptr && *env) from = " (from DDL_COORDINATOR)";
  }
  if (std::string why = checkCoordinatorAddress(cl.coordinator); !why.empty())
    return usageError(err, why + from);

  if (cl.insecure) {
    for (const std::string& address : splitAddressList(cl.coordinator)) {
      if (std::string why = tls::checkInsecure(address, "ddlctl"); !why.empty()) return usageError(err, why);
    }
  }
  Credentials credentials;
  if (std::string why = findCredentials(cl.ca, cl.tokenFile, &credentials); !why.empty()) {
    err << "ddlctl: " << why << "\nhint: give your token with --token-file, DDL_TOKEN_FILE or DDL_TOKEN\n";
    return kExitUnauthenticated;
  }
  Session session(cl, credentials, out, err);
  return runVerb(cl, session, err);
}

}  // namespace ddl::cli
