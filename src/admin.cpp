// Operations for a person or a tool (orpheus/admin.hpp): reads through the
// store's autocommit reads, changes through the record layer's transaction,
// under the record's lock, like an attempt's.
#include "orpheus/admin.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "orpheus/detail/record_row.hpp"
#include "orpheus/detail/records.hpp"
#include "progress.hpp"

namespace orpheus {
namespace {

// The terms of an operator's write: the configuration's, with the
// retention the request was made with when that is longer (found in
// review: a request made with a 30-day retention and resolved by hand was
// purged after the operator's 7 days, and a client retrying on day 10 ran
// it as a new request). As a completer finishing it would keep it.
lease_terms terms_for(const record& r, const config& c) {
  lease_terms t = detail::terms_of(c);
  // At most longest_duration, as the library takes it since: an older
  // version stored "forever" near int64's end, which these writes add to the
  // clock (found in review: the database refused the sum, and the record
  // could never be resolved).
  constexpr std::int64_t longest_us =
      std::chrono::duration_cast<std::chrono::microseconds>(detail::longest_duration).count();
  t.retention_us = std::max(t.retention_us, std::min(r.retention_us, longest_us));
  return t;
}

// The fingerprint plays no part here; validate() wants a well-formed one.
request_id id_of(std::string_view scope, std::string_view key) {
  request_id id{std::string(scope), std::string(key), fingerprint_of("")};
  validate(id);
  return id;
}

admin_result not_found(const request_id& id) {
  return {admin_result::status::not_found,
          "no record for scope '" + id.scope + "' and key '" + id.key + "'"};
}

admin_result refused(const record& r, std::string_view what) {
  return {admin_result::status::refused,
          std::string(what) + " (the record is " + std::string(to_string(r.state)) + ")"};
}

/// Why `verb` waits: an attempt's call downstream had an unknown outcome and
/// may still land (record::in_doubt_until_us). Deciding the outcome, or
/// compensating, before then could miss a charge that lands later.
std::string may_still_land(const record& r, std::string_view verb) {
  const std::int64_t left_s = (r.in_doubt_until_us - r.db_now_us + 999'999) / 1'000'000;
  return "a call downstream whose outcome was unknown may still land for " +
         std::to_string(left_s) + " s; " + std::string(verb) +
         " it after that, once you have asked the downstream service what happened";
}

}  // namespace

admin::admin(store& s, config c) : store_(s), config_(std::move(c)) { validate(config_); }

std::optional<record_report> admin::show(std::string_view scope, std::string_view key) {
  const request_id id = id_of(scope, key);
  auto rec = store_.inspect(id);
  if (!rec) return std::nullopt;
  record_report out{store_.shard_of(id), std::move(*rec), {}};
  const sql_value p[] = {id.scope, id.key, out.rec.created_us};
  for (const auto& row :
       store_.backend_for_records(out.shard).read(out.shard, store_.statements().history, p)) {
    const auto& v = row.values;
    out.history.push_back({static_cast<int>(detail::int_or_zero(v.at(0))),
                           detail::int_or_zero(v.at(1)), detail::text_or_empty(v.at(2)),
                           detail::text_or_empty(v.at(3)), detail::text_or_empty(v.at(4)),
                           detail::text_or_empty(v.at(5))});
  }
  return out;
}

std::vector<record_summary> admin::list(record_state state, std::chrono::milliseconds older_than,
                                        std::size_t limit) {
  if (older_than.count() < 0) throw bad_input_error(codes::invalid_request, "older_than < 0");
  // Up to `limit` from each shard, then the least recently changed of all
  // (found in review: filling the limit from shard 0 first hid older records
  // of later shards).
  std::vector<record_summary> out;
  for (std::size_t s = 0; s < store_.shard_count(); ++s) {
    const sql_value p[] = {
        std::int64_t{static_cast<int>(state)},
        std::chrono::duration_cast<std::chrono::microseconds>(older_than).count(),
        static_cast<std::int64_t>(limit)};
    for (const auto& row : store_.backend_for_records(s).read(s, store_.statements().list, p)) {
      const auto& v = row.values;
      record_summary r;
      r.shard = s;
      r.scope = detail::text_or_empty(v.at(0));
      r.key = detail::text_or_empty(v.at(1));
      r.state = static_cast<record_state>(detail::int_or_zero(v.at(2)));
      r.attempts = static_cast<int>(detail::int_or_zero(v.at(3)));
      r.created_us = detail::int_or_zero(v.at(4));
      r.updated_us = detail::int_or_zero(v.at(5));
      r.last_error = detail::text_or_empty(v.at(6));
      r.db_now_us = detail::int_or_zero(v.at(7));
      out.push_back(std::move(r));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const record_summary& a, const record_summary& b) {
    return a.updated_us < b.updated_us;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::vector<shard_stats> admin::stats() {
  std::vector<shard_stats> out;
  for (std::size_t s = 0; s < store_.shard_count(); ++s) {
    shard_stats st{.shard = s};
    for (const auto& row :
         store_.backend_for_records(s).read(s, store_.statements().count_by_state, {})) {
      const std::int64_t n = detail::int_or_zero(row.values.at(1));
      switch (static_cast<record_state>(detail::int_or_zero(row.values.at(0)))) {
        case record_state::in_progress:
          st.in_progress = n;
          break;
        case record_state::retryable:
          st.retryable = n;
          break;
        case record_state::succeeded:
          st.succeeded = n;
          break;
        case record_state::failed:
          st.failed = n;
          break;
        case record_state::parked:
          st.parked = n;
          break;
      }
    }
    out.push_back(st);
  }
  return out;
}

admin_result admin::requeue(std::string_view scope, std::string_view key, std::string_view note) {
  const request_id id = id_of(scope, key);
  auto t = detail::begin_record_tx(store_, id);
  const auto r = t->lock(id);
  if (!r) return not_found(id);
  if (r->state != record_state::parked) {
    t->rollback();
    return refused(*r, "only a parked request can be requeued");
  }
  const lease_terms terms = terms_for(*r, config_);
  if (!t->requeue(id, "requeued: " + std::string(note), terms)) {
    t->rollback();  // not reached: checked under the lock, as cancel()
    return refused(*r, "its state changed under the lock");
  }
  t->commit();
  return {};
}

admin_result admin::resolve(std::string_view scope, std::string_view key, const response& r,
                            std::string_view note) {
  const request_id id = id_of(scope, key);
  if (!is_final_status(r.status)) {
    throw bad_input_error(codes::invalid_request,
                          "a resolved response needs a final status, 200 to 599");
  }
  // Found in review: a Content-Type with a line break was recorded as given
  // and every replay sent the line after it as a header of its own; one of
  // 64 KB made every replay a final 500.
  if (auto why = detail::unsendable_header(r, 8192)) {
    throw bad_input_error(codes::invalid_request, "a resolved response's " + *why);
  }
  auto t = detail::begin_record_tx(store_, id);
  const auto rec = t->lock(id);
  if (!rec) return not_found(id);
  if (rec->in_doubt_until_us > rec->db_now_us && !is_terminal(rec->state)) {
    t->rollback();
    return refused(*rec, may_still_land(*rec, "resolve"));
  }
  const record_state final_state = r.status < 400 ? record_state::succeeded : record_state::failed;
  const lease_terms terms = terms_for(*rec, config_);
  if (!t->resolve(id, final_state, r, "resolved by an operator: " + std::string(note), terms)) {
    t->rollback();
    return refused(*rec, is_terminal(rec->state)
                             ? "a finished request cannot be resolved again"
                             : "an attempt may still be running (its call downstream too); "
                               "resolve it once it is parked or retryable");
  }
  t->commit();
  return {};
}

admin_result admin::cancel(std::string_view scope, std::string_view key, std::string_view note) {
  const request_id id = id_of(scope, key);
  auto t = detail::begin_record_tx(store_, id);
  const auto r = t->lock(id);
  if (!r) return not_found(id);
  const auto refuse = [&](std::string_view why) {
    t->rollback();
    return refused(*r, why);
  };
  if (r->state != record_state::parked && r->state != record_state::retryable) {
    return refuse(is_terminal(r->state)
                      ? "a finished request cannot be cancelled"
                      : "an attempt may still be running (its call downstream too); cancel it "
                        "once it is parked or retryable");
  }
  if (r->in_doubt_until_us > r->db_now_us) return refuse(may_still_land(*r, "cancel"));
  if (r->recovery_point.empty()) {
    return refuse(
        "a request of a single RPC has no steps to compensate: check downstream what happened "
        "and resolve it");
  }
  std::optional<detail::progress> p = detail::decode_progress(r->recovery_point);
  if (!p) return refuse("its recovery point does not read in this version");
  if (p->compensating)
    return refuse("it is already going backwards (" + p->compensating->code + ")");
  if (p->pivot_may_have_run()) {
    return refuse("its pivot (step " + p->names[p->pivot] +
                  ") has run or may have run: it only goes forward; requeue it, or check "
                  "downstream and resolve it");
  }
  p->compensating =
      error_info::of(error_class::rejected, codes::request_cancelled, "the request was cancelled");
  const std::string why = "cancelled by an operator: " + std::string(note);
  if (!t->cancel(id, detail::encode_progress(*p), why, terms_for(*r, config_))) {
    return refuse("its state changed under the lock");  // not reached: checked above
  }
  t->commit();
  return {};
}

std::size_t admin::purge(std::size_t batch_limit) {
  if (batch_limit == 0) throw bad_input_error(codes::invalid_request, "batch_limit is 0");
  std::size_t total = 0;
  // A shard that fails does not stop the others, as in
  // manager::purge_expired() (found in review: with shard 0 down or not yet
  // migrated, `orpheusctl purge` purged nothing anywhere). The first
  // failure is still the answer, so the command says it did not finish.
  std::exception_ptr first_failure;
  for (std::size_t s = 0; s < store_.shard_count(); ++s) {
    try {
      while (const std::size_t n = store_.purge_expired(s, batch_limit)) total += n;
    } catch (const error&) {
      if (!first_failure) first_failure = std::current_exception();
    }
  }
  if (first_failure) std::rethrow_exception(first_failure);
  return total;
}

}  // namespace orpheus
