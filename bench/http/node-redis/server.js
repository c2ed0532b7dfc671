// Comparator for scripts/bench-node (issue 8), not part of Orpheus: the
// payments endpoint of examples/payments_server written the way a Node shop
// would, with Express 5, the npm idempotency layer @node-idempotency/core and
// its Redis storage adapter. Redis is started by the script with
// `appendfsync always`, so each write the layer makes is on disk before Redis
// answers it (Redis fsyncs the writes of one event-loop pass together).
//
//   POST /v1/payments  Idempotency-Key (required), X-Client-Id (the caller),
//                      JSON {"amount": 1000, "currency": "usd", "customer": "c1"}
//                      201 {"id", "amount", "currency", "customer", "status",
//                      "charge_id"}; a replay answers the recorded status and
//                      body with Idempotent-Replayed: true, without the bank.
//
// Environment: PORT (default 0, any free port), BANK_URL (the bank simulator,
// e.g. http://127.0.0.1:9000), REDIS_PORT (Redis on 127.0.0.1). Prints
// "listening on PORT" once ready, as the project's servers do.
"use strict";

const crypto = require("node:crypto");
const http = require("node:http");
const express = require("express");
const { Idempotency, IdempotencyError, IdempotencyErrorCodes } = require("@node-idempotency/core");
const { RedisStorageAdapter } = require("@node-idempotency/storage-adapter-redis");

const PORT = Number(process.env.PORT || 0);
const BANK = new URL(process.env.BANK_URL || "http://127.0.0.1:9000");
const REDIS_PORT = Number(process.env.REDIS_PORT || 6379);

// The bank simulator over HTTP, on kept-alive connections (as the payments
// server's bank client): POST /charges with the downstream Idempotency-Key,
// so that the bank deduplicates a key it has seen (200, first outcome).
const bankAgent = new http.Agent({ keepAlive: true, maxSockets: 64 });
function charge(key, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(
      {
        agent: bankAgent,
        host: BANK.hostname,
        port: BANK.port,
        method: "POST",
        path: "/charges",
        timeout: 5000,
        headers: {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(data),
          "Idempotency-Key": key,
        },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (text += chunk));
        res.on("end", () => {
          let json = null;
          try {
            json = JSON.parse(text);
          } catch {
            // not JSON: json stays null
          }
          resolve({ status: res.statusCode, body: json });
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("bank timeout")));
    req.on("error", reject);
    req.end(data);
  });
}

// Status codes for the layer's refusals: the mapping of the project's own
// (unpublished) express plugin, @node-idempotency/shared's idempotency2HttpCodeMap.
const refusal = {
  [IdempotencyErrorCodes.IDEMPOTENCY_FINGERPRINT_MISSMATCH]: 422,
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_LEN_EXEEDED]: 400, // also "key missing"
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_MISSING]: 400,
  [IdempotencyErrorCodes.REQUEST_IN_PROGRESS]: 409,
};

async function main() {
  const storage = new RedisStorageAdapter({ socket: { host: "127.0.0.1", port: REDIS_PORT } });
  await storage.connect();
  const idempotency = new Idempotency(storage, {
    enforceIdempotency: true, // no Idempotency-Key: 400, as payments_server
    // A concurrent duplicate is refused (409 + Retry-After), not waited for.
    inProgressStrategy: { wait: false },
  });

  const app = express();
  app.disable("x-powered-by");
  app.disable("etag");
  app.use(express.json());

  app.post("/v1/payments", async (req, res) => {
    const client = req.get("X-Client-Id") || "";
    const p = req.body || {};
    if (!Number.isInteger(p.amount) || p.amount <= 0 || typeof p.currency !== "string" ||
        !/^[A-Za-z]{3}$/.test(p.currency) || typeof p.customer !== "string" || !p.customer) {
      return res.status(400).json({ error: "amount, currency and customer are required" });
    }
    // What the layer sees of the request: keys are scoped by caller (the cache
    // key's prefix), the fingerprint is of the parsed body.
    const ireq = {
      method: req.method,
      path: req.path,
      headers: req.headers,
      body: p,
      options: { cacheKeyPrefix: `node-idempotency:${client}` },
    };

    let recorded;
    try {
      // New key: SET NX of an IN_PROGRESS record (one durable write), then
      // undefined. Seen key: its recorded answer; in progress or another body:
      // an IdempotencyError.
      recorded = await idempotency.onRequest(ireq);
    } catch (err) {
      if (!(err instanceof IdempotencyError)) throw err;
      if (err.code === IdempotencyErrorCodes.REQUEST_IN_PROGRESS) res.set("Retry-After", "1");
      return res.status(refusal[err.code] || 500).json({ error: err.message });
    }
    if (recorded) { // a replay: the recorded answer, no bank call
      res.set("Idempotent-Replayed", "true");
      return res.status(recorded.additional.status).json(recorded.body ?? recorded.error);
    }

    // First time: charge. The payment's id (the bank's "reference") and the
    // downstream key both come from the caller's key in its scope, the same on
    // every attempt: scripts/bench-node runs the bank without deduplication,
    // so a key charged twice shows in its ledger as one reference charged
    // twice.
    const scoped = `${client}:${req.get("Idempotency-Key")}`;
    const id = "pay_" + crypto.createHash("sha256").update(scoped).digest("hex").slice(0, 20);
    let answer;
    try {
      answer = await charge(scoped, { amount: p.amount, currency: p.currency, reference: id });
    } catch {
      answer = { status: 0, body: null };
    }
    let status, body;
    if (answer.body && answer.body.status === "charged") {
      status = 201;
      body = { id, amount: p.amount, currency: p.currency, customer: p.customer,
               status: "succeeded", charge_id: answer.body.charge_id };
    } else if (answer.status === 402) {
      status = 402;
      body = { error: "card_declined" };
    } else {
      // Outcome unknown (timeout, 5xx): core has no way to release a key, so it
      // stays IN_PROGRESS until its TTL (a retry gets 409), and the caller is
      // told the payment may not have gone through.
      return res.status(502).json({ error: "the bank's outcome is unknown" });
    }
    // Record the answer (a SET, one more durable write) before sending it, so
    // that a replay after the 201 always finds it.
    await idempotency.onResponse(ireq, status < 400 ? { body, additional: { status } }
                                                    : { error: body, additional: { status } });
    res.status(status).json(body);
  });

  const server = app.listen(PORT, "127.0.0.1", () => {
    console.log(`listening on ${server.address().port}`);
  });
  server.keepAliveTimeout = 60000;
  const stop = () => server.close(() => storage.disconnect().then(() => process.exit(0)));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
