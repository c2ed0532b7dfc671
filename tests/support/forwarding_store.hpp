// A store whose backend forwards to a real store's backend, with hooks: for
// counting the library's statements and for injecting a failure at an exact
// point (the database behind it stays real).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string_view>

#include "orpheus/detail/records.hpp"
#include "orpheus/store.hpp"

namespace orpheus::test {

struct forwarding_hooks {
  /// Called with every record statement's name ("read", "insert", ...).
  std::function<void(std::string_view)> on_statement;
  /// Called with the transaction's number (0-based, in begin() order) right
  /// before its COMMIT.
  std::function<void(int, transaction&)> before_commit;
  /// Called when the fast-path read has returned its rows, before the
  /// library sees them.
  std::function<void()> after_read;
  /// Called before every read outside a transaction (the fast path, the
  /// shard map's checks), with its shard and statement.
  std::function<void(std::size_t, std::string_view)> before_read;
};

class forwarding_backend final : public store_backend {
 public:
  forwarding_backend(store& inner, std::shared_ptr<forwarding_hooks> hooks)
      : inner_(inner.backend()), sql_(inner.statements()), hooks_(std::move(hooks)) {}

  [[nodiscard]] std::size_t shard_count() const override { return inner_.shard_count(); }
  [[nodiscard]] const sql_dialect& dialect() const override { return inner_.dialect(); }
  [[nodiscard]] std::span<const detail::migration> migrations() const override {
    return inner_.migrations();
  }
  std::unique_ptr<backend_tx> begin(std::size_t shard) override {
    return std::make_unique<wrapped>(*this, inner_.begin(shard), begins_++);
  }
  sql_rows read(std::size_t shard, std::string_view sql,
                std::span<const sql_value> params) override {
    note(sql);
    if (hooks_->before_read) hooks_->before_read(shard, sql);
    auto rows = inner_.read(shard, sql, params);
    if (hooks_->after_read && sql == sql_.read_fast) hooks_->after_read();
    return rows;
  }
  void exclusively(std::size_t shard, const std::function<void(tx&)>& f) override {
    inner_.exclusively(shard, f);
  }
  [[nodiscard]] bool already_applied(const storage_error& e) const noexcept override {
    return inner_.already_applied(e);
  }

 private:
  /// Names the record layer's statements; the application's are not named.
  void note(std::string_view sql) {
    if (!hooks_->on_statement) return;
    const std::pair<const std::string&, std::string_view> names[] = {
        {sql_.read_fast, "read"},
        {sql_.insert, "insert"},
        {sql_.lock, "lock"},
        {sql_.save_pre_state, "save_pre_state"},
        {sql_.take_lease, "take_lease"},
        {sql_.finish, "finish"},
        {sql_.release, "release"},
        {sql_.mark_in_doubt_unfenced, "mark_in_doubt_unfenced"}};
    for (const auto& [text, name] : names) {
      if (sql == text) hooks_->on_statement(name);
    }
  }

  struct wrapped final : backend_tx {
    wrapped(forwarding_backend& o, std::unique_ptr<backend_tx> t, int n)
        : owner(o), inner(std::move(t)), number(n) {}
    sql_rows query_values(std::string_view s, std::span<const sql_value> p) override {
      owner.note(s);
      return inner->query_values(s, p);
    }
    std::uint64_t execute_values(std::string_view s, std::span<const sql_value> p) override {
      owner.note(s);
      return inner->execute_values(s, p);
    }
    [[nodiscard]] std::size_t shard() const override { return inner->shard(); }
    bool insert_if_absent(std::string_view s, std::span<const sql_value> p) override {
      owner.note(s);
      return inner->insert_if_absent(s, p);
    }
    bool execute_fenced(std::string_view s, std::span<const sql_value> p,
                        storage_error (*on_fence_failure)()) override {
      owner.note(s);
      return inner->execute_fenced(s, p, on_fence_failure);
    }
    void commit() override {
      if (owner.hooks_->before_commit) owner.hooks_->before_commit(number, *inner);
      if (owner.hooks_->on_statement) owner.hooks_->on_statement("commit");
      inner->commit();
    }
    void rollback() noexcept override { inner->rollback(); }

    forwarding_backend& owner;
    std::unique_ptr<backend_tx> inner;
    int number;
  };

  store_backend& inner_;
  const detail::record_sql& sql_;
  std::shared_ptr<forwarding_hooks> hooks_;
  std::atomic<int> begins_{0};
};

class forwarding_store : public store {
 public:
  explicit forwarding_store(store& inner)
      : forwarding_store(inner, std::make_shared<forwarding_hooks>()) {}

  std::function<void(std::string_view)>& on_statement;
  std::function<void(int, transaction&)>& before_commit;
  std::function<void()>& after_read;
  std::function<void(std::size_t, std::string_view)>& before_read;

 private:
  forwarding_store(store& inner, const std::shared_ptr<forwarding_hooks>& hooks)
      : store(std::make_unique<forwarding_backend>(inner, hooks)),
        on_statement(hooks->on_statement),
        before_commit(hooks->before_commit),
        after_read(hooks->after_read),
        before_read(hooks->before_read),
        hooks_(hooks) {}

  std::shared_ptr<forwarding_hooks> hooks_;
};

}  // namespace orpheus::test
