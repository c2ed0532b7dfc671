// The smallest complete use of Orpheus: one idempotent payment on SQLite.
#include <iostream>

#include "orpheus/manager.hpp"
#include "orpheus/store/sqlite.hpp"

int main() {
  orpheus::sqlite_store store({.path = "quickstart.db"});
  store.migrate();
  orpheus::manager manager(store);
  {
    auto t = store.begin_on_shard(0);
    t->execute(
        "CREATE TABLE IF NOT EXISTS payments (id TEXT PRIMARY KEY, amount INT, charge TEXT)");
    t->commit();
  }

  /// [usage]
  const orpheus::request_id id{"client-42", "order-1001-pay",
                               orpheus::fingerprint_of("amount=1250")};
  orpheus::response r = manager.process(
      id,
      [&](orpheus::tx& tx) {  // Pre-RPC: database only, once per key
        tx.execute("INSERT INTO payments (id, amount) VALUES (?, ?)", id.key, 1250);
        return std::string(id.key);
      },
      [&](const orpheus::attempt& a, const std::string& payment) {  // RPC: network only
        // A real RPC calls the gateway with a.downstream_key("charge") and,
        // when a.is_retry(), asks the gateway first what became of it.
        return "ch_" + a.downstream_key("charge") + " for " + payment;
      },
      [&](orpheus::tx& tx, const orpheus::attempt&, const std::string& charge) {  // Post-RPC
        // Called on success only. A declined charge is recorded (and
        // replayed) by the library; a timeout leaves the key retryable.
        tx.execute("UPDATE payments SET charge = ? WHERE id = ?", charge, id.key);
        return orpheus::response{201, {{"Content-Type", "text/plain"}}, charge};
      });
  /// [usage]

  std::cout << r.status << (r.replayed ? " (replayed) " : " ") << r.body << "\n";
  return 0;
}
