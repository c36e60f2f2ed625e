// ddlctl: the user CLI of ddl. Everything but main() lives in ddlctl_lib (the other files of cli/), where
// tests can reach it.
#include <grpc/support/log.h>

#include <cstdlib>
#include <iostream>

#include "ddlctl.h"

int main(int argc, char** argv) {
  // gRPC's own log lines (a handshake that failed, a connection refused) would come above ddlctl's message,
  // which says the same for a person and what to do. GRPC_VERBOSITY set by the user still shows them.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function([](gpr_log_func_args*) {});
  return ddl::cli::runDdlctl(argc, argv, std::cout, std::cerr);
}
