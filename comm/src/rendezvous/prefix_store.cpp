// PrefixStore (store.h): every key of another store under a prefix.
#include "rendezvous/store.h"

namespace ddl {
namespace {

class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override { base_->set(prefix_ + key, value); }
  std::string get(const std::string& key, const Deadline& deadline) override {
    return base_->get(prefix_ + key, deadline);
  }
  std::vector<std::string> getMany(const std::vector<std::string>& keys, const Deadline& deadline) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    return base_->getMany(full, deadline);
  }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(prefix_ + key, delta); }
  bool canAdd() const override { return base_->canAdd(); }

 private:
  const std::shared_ptr<Store> base_;
  const std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> makePrefixStore(std::shared_ptr<Store> base, const std::string& prefix) {
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace ddl
