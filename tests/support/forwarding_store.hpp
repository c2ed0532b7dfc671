// A store that forwards to a real one, with hooks: for counting the
// library's statements and for injecting a failure at an exact point (the
// database behind it stays real).
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "orpheus/store.hpp"

namespace orpheus::test {

class forwarding_store : public store {
 public:
  explicit forwarding_store(store& inner) : inner_(inner) {}

  /// Called with every library statement's name ("read", "insert", ...).
  std::function<void(std::string_view)> on_statement;
  /// Called with the transaction's number (0-based, in begin() order) right
  /// before its COMMIT.
  std::function<void(int, store_tx&)> before_commit;

  std::size_t shard_count() const override { return inner_.shard_count(); }
  std::size_t shard_of(const request_id& id) const override { return inner_.shard_of(id); }
  std::optional<record> read(const request_id& id) override {
    note("read");
    return inner_.read(id);
  }
  std::optional<record> inspect(const request_id& id) override { return inner_.inspect(id); }
  std::unique_ptr<store_tx> begin(const request_id& id) override {
    return std::make_unique<wrapped>(*this, inner_.begin(id), begins_++);
  }
  std::unique_ptr<store_tx> begin_on_shard(std::size_t s) override {
    return inner_.begin_on_shard(s);
  }
  std::size_t purge_expired(std::size_t s, std::size_t l) override {
    return inner_.purge_expired(s, l);
  }
  void migrate() override { inner_.migrate(); }
  int schema_version(std::size_t s) override { return inner_.schema_version(s); }

 private:
  void note(std::string_view what) {
    if (on_statement) on_statement(what);
  }

  struct wrapped final : store_tx {
    wrapped(forwarding_store& o, std::unique_ptr<store_tx> t, int n)
        : owner(o), inner(std::move(t)), number(n) {}
    sql_rows query_values(std::string_view s, std::span<const sql_value> p) override {
      return inner->query_values(s, p);
    }
    std::uint64_t execute_values(std::string_view s, std::span<const sql_value> p) override {
      return inner->execute_values(s, p);
    }
    std::size_t shard() const override { return inner->shard(); }
    bool insert(const request_id& i, std::string_view o, const lease_terms& l) override {
      owner.note("insert");
      return inner->insert(i, o, l);
    }
    std::optional<record> lock(const request_id& i) override {
      owner.note("lock");
      return inner->lock(i);
    }
    bool save_pre_state(const request_id& i, std::string_view o, std::string_view j) override {
      owner.note("save_pre_state");
      return inner->save_pre_state(i, o, j);
    }
    void take_lease(const request_id& i, std::string_view o, int a, const lease_terms& l) override {
      owner.note("take_lease");
      inner->take_lease(i, o, a, l);
    }
    bool finish(const request_id& i, std::string_view o, record_state s, const response& r,
                std::string_view e, const lease_terms& l) override {
      owner.note("finish");
      return inner->finish(i, o, s, r, e, l);
    }
    bool release(const request_id& i, std::string_view o, std::string_view w) override {
      owner.note("release");
      return inner->release(i, o, w);
    }
    void commit() override {
      if (owner.before_commit) owner.before_commit(number, *inner);
      owner.note("commit");
      inner->commit();
    }
    void rollback() noexcept override { inner->rollback(); }

    forwarding_store& owner;
    std::unique_ptr<store_tx> inner;
    int number;
  };

  store& inner_;
  std::atomic<int> begins_{0};
};

}  // namespace orpheus::test
