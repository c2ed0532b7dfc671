// One payment, sent the careful way. See --help.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "../common/flags.hpp"
#include "orpheus/api_keys.hpp"
#include "orpheus/client/client.hpp"
#include "orpheus/client/journal.hpp"
#include "orpheus/request.hpp"

namespace {
constexpr const char* usage = R"(pay_client: make one payment through payments_server, with retries

Usage: pay_client --server URL --amount N [flags]
  --server URL        the payments server, e.g. http://127.0.0.1:8080
  --api-key KEY       the caller's API key, sent as `Authorization: Bearer
                      KEY`; by default the environment's ORPHEUS_API_KEY (a
                      flag shows in the process list, the environment not)
  --client ID         instead of a key, for a server run with
                      --trust-client-id-header (local testing): X-Client-Id;
                      ORPHEUS_API_KEY is then not used
  --amount N          minor units, e.g. 1250
  --currency C        three letters (default EUR)
  --customer C        (default cus_1)
  --key K             the idempotency key (default: a new UUIDv4, or the
                      journal's key for --name); not with --journal: a
                      payment sent with --key K is resumed with --key K
  --journal PATH      a SQLite key journal: the key is written there before
                      the first send, so a crashed client resumes with it
  --name NAME         the logical request's name in the journal (required
                      with --journal); once its answer settled it, the name
                      is refused (exit 2, naming the key: within the
                      server's retention, send --key K without --journal to
                      read the answer again; the message says when not)
  --resume-within-ms N  a journal entry started longer ago is refused, never
                      sent again (default 518400000, 6 days; at least 1000):
                      keep it below the server's retention (payments_server
                      --retention-ms), or a resumed key the server has
                      forgotten runs as a new payment
  --attempts N        attempt cap (default 8)
  --deadline-ms N     overall deadline (default 90000, the library's: it
                      outlasts a lease take-over on a server with the
                      default 30 s lease; see docs/client.md)

Prints the answer and how it was reached; exits 0 on a 2xx answer, 1 on any
other answer, 2 on bad flags or a refusal by the journal, 3 when it gave up without a final answer or
when the answer does not say what became of an earlier attempt that may
have gone through (a 401 after a lost answer, say): then run it again with
the same key (the journal keeps it). With --key, or a key an earlier run
left in the journal, every answer but a 2xx or a replay is such an answer:
a refusal that retrying cannot cure (a 422 for a key used with another
payload) exits 3 on every run, and needs a person.
)";
}  // namespace

int main(int argc, char** argv) {
  examples::flags f(argc, argv, usage);
  const auto server = f.str("server", "");
  const auto client = f.str("client", "");
  // The environment's key is the default only when no --client says who
  // is paying (found in review: an exported key blocked --client).
  const char* env_key = std::getenv("ORPHEUS_API_KEY");
  const auto api_key = f.str("api-key", env_key != nullptr && client.empty() ? env_key : "");
  const long amount = f.num("amount", 0, 1, 1L << 53);
  const auto currency = f.str("currency", "EUR");
  const auto customer = f.str("customer", "cus_1");
  auto key = f.str("key", "");
  const auto journal_path = f.str("journal", "");
  const auto name = f.str("name", "");
  // Found in review: fixed at 6 days, so with a server keeping records for a
  // day a key resumed on day 3 ran as a new payment.
  orpheus::client::journal_options journal_options;
  journal_options.resume_within = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::milliseconds(f.millis("resume-within-ms", 6L * 24 * 3600 * 1000, 1000)));
  orpheus::client::client_options options;
  options.policy.max_attempts = static_cast<int>(f.num("attempts", 8, 1, 1000));
  // Issue 7, defect 11: this was 30000, the server's whole lease, so a 409
  // for the rest of a lost attempt's lease ended the call.
  options.policy.deadline =
      std::chrono::milliseconds(f.millis("deadline-ms", options.policy.deadline.count(), 1));
  f.done();
  if (server.empty() || amount <= 0) f.fail("--server and --amount are required");
  if (api_key.empty() == client.empty()) {
    f.fail("say who is paying: --api-key (or ORPHEUS_API_KEY), or else --client");
  }
  if (!journal_path.empty() && name.empty()) f.fail("--journal needs --name");
  // Found in review: --key with --journal on a new name wrote a new key to
  // the journal and then refused, so a run without --key sent that key
  // instead of the one a run with --key K may already have paid with.
  if (!journal_path.empty() && !key.empty()) {
    f.fail(
        "--key and --journal do not go together: a payment sent with --key K is resumed with "
        "--key K (without --journal), one started with --journal by its --name");
  }
  // Everything checked before the journal is written (found in review: a bad
  // --server left an entry behind, and the corrected run was "resuming").
  if (auto why = orpheus::invalid_key_reason(key); !key.empty() && why) f.fail("--key: " + *why);
  // The server's own rules (examples/payments_server/payment.cpp): found in
  // review, a typo was refused by the server with a 400, which settles the
  // journal's entry, and the corrected run found its --name used up.
  if (currency.size() != 3 || !std::all_of(currency.begin(), currency.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
      })) {
    f.fail("--currency must be a three-letter code, got '" + currency + "'");
  }
  if (customer.empty() || customer.size() > 64) f.fail("--customer must be 1 to 64 characters");
  // Sent as a header: what HTTP cannot carry is refused here, before the
  // journal is written (the client library refuses it too, later). A key
  // that is not a token68 is one no server's key file holds.
  if (!api_key.empty() && orpheus::bearer_token("Bearer " + api_key) != api_key) {
    f.fail("--api-key must be a bearer token: letters, digits and -._~+/, then = padding only");
  }
  if (std::any_of(client.begin(), client.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    f.fail("--client must not hold control bytes");
  }
  std::optional<orpheus::beast::http_endpoint> endpoint;
  try {
    endpoint = orpheus::beast::parse_http_url(server);
    orpheus::client::validate(options.policy);
  } catch (const std::exception& e) {
    f.fail(e.what());
  }

  try {
    const std::string body =
        nlohmann::json{{"amount", amount}, {"currency", currency}, {"customer", customer}}.dump();
    std::unique_ptr<orpheus::client::sqlite_key_journal> journal;
    // A key given, or one an earlier run left in the journal, may have been
    // sent already: only an answer that says what became of it settles it.
    bool resuming = !key.empty();
    if (!journal_path.empty()) {
      journal =
          std::make_unique<orpheus::client::sqlite_key_journal>(journal_path, journal_options);
      // The name is bound to where the request goes and as whom, not only
      // to its body (found in review: resumed with another --client or
      // --server, the key went to a scope or a store without its record,
      // and ran as a new payment). The API key is hashed in, not stored.
      const std::string caller = api_key.empty() ? "client " + client : "api key " + api_key;
      const auto bound = orpheus::fingerprint_of(server + "\n" + caller + "\n" + body);
      const auto entry = [&] {
        try {
          return journal->entry_for(name, bound);
        } catch (const orpheus::client::payload_changed&) {
          // An entry an older pay_client wrote, bound to the body alone: it
          // is resumed as that one would (a refusal would send a new key
          // for a payment that may be made).
          return journal->entry_for(name, orpheus::fingerprint_of(body));
        }
      }();
      key = entry.key;
      resuming = entry.resumed;
    }
    if (key.empty()) key = orpheus::client::new_idempotency_key();
    std::cout << "key " << key << std::endl;  // before the first send

    options.on_attempt = [](const orpheus::client::attempt_info& a) {
      std::cerr << "attempt " << a.number << ": "
                << (a.status != 0 ? std::to_string(a.status) : a.error)
                << (a.wait.count() > 0 ? ", retrying in " + std::to_string(a.wait.count()) + " ms"
                                       : "")
                << "\n";
    };
    orpheus::client::idempotent_client api(*endpoint, options);
    orpheus::client::prepared_request req(
        boost::beast::http::verb::post, "/v1/payments", body,
        {{"Content-Type", "application/json"},
         api_key.empty()
             ? std::pair<std::string, std::string>{"X-Client-Id", client}
             : std::pair<std::string, std::string>{"Authorization", "Bearer " + api_key}},
        key);
    req.resuming(resuming);
    const auto r = api.send(req);
    if (r.why != orpheus::client::stop_reason::answered) {
      std::cout << "gave up after " << r.attempts << " attempts (" << r.elapsed.count() << " ms)\n";
      return 3;
    }
    // The journal keeps the key until the answer says what became of the
    // payment: after a lost answer, a 401 (say) does not, and a new key
    // could pay twice.
    if (journal && r.settled()) {
      // Found in review: a journal that could not be written (a full disk,
      // another process holding it past the busy timeout) made a paid
      // payment exit 2, "nothing sent", with no answer printed. The entry
      // stays pending: a run with the same --name resumes its key and reads
      // the answer again.
      try {
        journal->complete(name);
      } catch (const std::exception& e) {
        std::cerr << "pay_client: the answer below came, but the journal could not mark " << name
                  << " complete (" << e.what() << "); running again with --name " << name
                  << " resends key " << key << " and reads the same answer\n";
      }
    }
    std::cout << "status " << r.response->result_int() << (r.replayed ? " replayed" : "") << "\n"
              << "attempts " << r.attempts << "\n"
              << r.response->body() << "\n";
    if (!r.settled()) {
      std::cout << "unsettled: an earlier attempt may have gone through, and this answer does "
                   "not say; send it again later with key "
                << key << "\n";
      return 3;
    }
    return r.response->result_int() / 100 == 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "pay_client: " << e.what() << "\n";
    return 2;
  }
}
