// ddlctl: the user CLI of ddl. Everything but main() lives in ddlctl_lib (the other files of cli/), where
// tests can reach it.
#include <iostream>

#include "ddlctl.h"

int main(int argc, char** argv) { return ddl::cli::runDdlctl(argc, argv, std::cout, std::cerr); }
