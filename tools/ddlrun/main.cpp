// ddlrun: the local launcher of ddl jobs (ddlrun -np N -- PROGRAM ARGS...). This file only maps the command
// line to an exit status; parsing lives in options.cpp and supervising the ranks in launcher.cpp, where tests
// can reach them.
#include <cstdio>
#include <string>
#include <vector>

#include "common/version.h"
#include "launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  ddl::launcher::ParseResult parsed = ddl::launcher::parseArgs(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n%s", parsed.error.c_str(), ddl::launcher::usageSynopsis());
    return 2;
  }
  parsed.options.started_as = argv[0] != nullptr ? argv[0] : "";
  if (parsed.options.help) {
    std::fputs(ddl::launcher::usage(), stdout);
    return 0;
  }
  if (parsed.options.version) {
    std::printf("ddlrun %s\n", ddl::kVersion);
    return 0;
  }
  return ddl::launcher::run(parsed.options);
}
