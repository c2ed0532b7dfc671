#include <iostream>

#include "orpheus/client/client.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/payment/charge.hpp"
#include "orpheus/store/sqlite.hpp"
#if CONSUMER_WITH_MYSQL  // tests/install/consumer/CMakeLists.txt
#include "orpheus/store/mysql.hpp"
#endif
#if CONSUMER_WITH_GRPC
#include "orpheus/grpc/unary.hpp"
#endif

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  orpheus::sqlite_store store({.path = argv[1]});
  store.migrate();
  orpheus::manager m(store);
  const orpheus::request_id id{"consumer", "key-1", orpheus::fingerprint_of("x")};
  auto run = [&] {
    return m.process(
        id, [](orpheus::tx&) { return 1; }, [](const orpheus::attempt&, int n) { return n + 1; },
        [](orpheus::tx&, const orpheus::attempt&, const orpheus::outcome<int>& o) {
          return orpheus::response{200, {}, std::to_string(o.value())};
        });
  };
  const auto first = run();
  const auto second = run();
#if CONSUMER_WITH_MYSQL
  // The MySQL backend links too (its options are checked without a server).
  try {
    orpheus::mysql_store bad(orpheus::mysql_options{});
    return 1;
  } catch (const orpheus::config_error&) {
  }
#endif
  // The adapters link too.
  if (orpheus::client::new_idempotency_key().size() != 36) return 1;
  if (orpheus::payment::charge_id_of({orpheus::payment::gateway_status::charged, "ch", ""}) != "ch")
    return 1;
#if CONSUMER_WITH_GRPC
  // A held key is UNAVAILABLE ("retry this call"), and a client may send it
  // again.
  const auto held = orpheus::grpc::status_of(
      orpheus::error_info::of(orpheus::error_class::conflict, orpheus::codes::in_progress, "busy"));
  if (held.error_code() != ::grpc::StatusCode::UNAVAILABLE || !orpheus::grpc::may_retry(held)) {
    return 1;
  }
#endif
  std::cout << first.body << " " << second.replayed << "\n";
  return first.body == "2" && second.replayed && !first.replayed ? 0 : 1;
}
