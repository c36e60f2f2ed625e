// A directory under the system's temporary directory for one test, removed with everything in it when the
// test ends: the PKI directories, users files and node files of the security and admin tests. Threads: one
// test's.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/pki.h"

namespace ddl::test_util {

class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              ("ddl-sec-" + std::to_string(getpid()) + "-" + pki::randomHex(4))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ddl::test_util
