// Orpheus, all of the core's public API in one include.
//
//   #include "orpheus/orpheus.hpp"        // the core: library orpheus::core
//   #include "orpheus/store/sqlite.hpp"   // a backend: its own library
//
//   orpheus::sqlite_store store({.path = "payments.db"});
//   store.migrate();
//   orpheus::manager manager(store);
//   auto r = manager.process(id, pre, rpc, post);   // see manager.hpp
//
// What it brings: errors and their retry classes (error.hpp, and every code
// the library emits with its class in codes.hpp), request identity, recorded
// responses and attempts (request.hpp), a failure's HTTP status and
// problem+json form (problem.hpp), keys and fingerprints from a request
// given as plain strings (identify.hpp), the
// transaction handle of the Pre-RPC and Post-RPC phases (tx.hpp), the records
// and the store interface (store.hpp), key-to-shard mapping (shard_map.hpp),
// how a downstream call can fail without an answer (transport.hpp), a
// bounded thread pool for the blocking phases (work_pool.hpp), the log sink
// (log.hpp) and the manager (manager.hpp). It links with orpheus::core alone:
// it includes no database and no Beast header.
//
// What it leaves out, because each needs its own library (CMake target):
//   orpheus/store/sqlite.hpp     orpheus::sqlite   the SQLite backend
//   orpheus/store/mysql.hpp      orpheus::mysql    the MySQL/MariaDB backend
//                                                  (built with ORPHEUS_WITH_MYSQL)
//   orpheus/beast/*.hpp          orpheus::beast    HTTP middleware, server, client
//   orpheus/client/*.hpp         orpheus::client   the retrying client, key journal
//   orpheus/payment/charge.hpp   orpheus::payment  a classified payment call
// orpheus/detail/* are internals that the headers above include as needed.
#pragma once

#include "orpheus/api_keys.hpp"
#include "orpheus/codes.hpp"
#include "orpheus/error.hpp"
#include "orpheus/identify.hpp"
#include "orpheus/log.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/problem.hpp"
#include "orpheus/request.hpp"
#include "orpheus/shard_map.hpp"
#include "orpheus/steps.hpp"
#include "orpheus/store.hpp"
#include "orpheus/transport.hpp"
#include "orpheus/tx.hpp"
#include "orpheus/work_pool.hpp"
