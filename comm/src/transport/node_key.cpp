// localNodeKey (node_key.h): the boot id and the namespaces' inodes that tell which ranks share a node.
#include "transport/node_key.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ddl {
namespace {

std::string firstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string nsInode(const char* path) {
  struct stat st {};
  if (stat(path, &st) != 0) return "";
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

}  // namespace

std::string localNodeKey() {
  static const std::string key = [] {
    std::string k = firstLine("/proc/sys/kernel/random/boot_id") + "/" + nsInode("/proc/self/ns/ipc") + "/" +
                    nsInode("/proc/self/ns/mnt") + "/" + nsInode("/proc/self/ns/net") + "/" +
                    nsInode("/proc/self/ns/pid");
    // Splits a machine into nodes, never joins two: the tag is added to what tells machines apart.
    if (const char* tag = std::getenv("DDL_NODE_TAG"); tag && *tag) k += std::string("/tag:") + tag;
    return k;
  }();
  return key;
}

}  // namespace ddl
