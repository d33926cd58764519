// Run by tests/e2e/test_sql_node.py against a real database, relay and worker
// (JOBCORE_TEST_DATABASE_URL); the database has the application's own `orders` table.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import { Refusal, enqueue } from "../enqueue.mjs";

const url = process.env.JOBCORE_TEST_DATABASE_URL;
const TENANT = "node";
let pool;

before(() => {
  assert.ok(url, "JOBCORE_TEST_DATABASE_URL is not set");
  pool = new pg.Pool({ connectionString: url, max: 2 });
});

after(async () => {
  await pool.end();
});

async function inTransaction(work, { commit = true } = {}) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const result = await work(client);
    await client.query(commit ? "COMMIT" : "ROLLBACK");
    return result;
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  } finally {
    client.release();
  }
}

async function job(id) {
  const { rows } = await pool.query("SELECT status, attempts FROM jobcore.jobs WHERE id = $1", [id]);
  return rows[0];
}

async function until(check, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100)); // poll interval, bounded above
  }
}

test("an order and its job commit together, and the job runs once", async () => {
  const id = await inTransaction(async (client) => {
    await client.query("INSERT INTO orders (id, total) VALUES (1, 10)");
    return enqueue(client, "echo", { text: "receipt 1" }, { tenant: TENANT, priority: "high" });
  });
  assert.match(id, /^[0-9a-f-]{36}$/);
  const done = await until(async () => {
    const row = await job(id);
    return row?.status === "succeeded" ? row : undefined;
  }, "the job to succeed");
  assert.equal(done.attempts, 1);
});

test("a rollback leaves neither the order nor the job", async () => {
  const id = await inTransaction(
    async (client) => {
      await client.query("INSERT INTO orders (id, total) VALUES (2, 20)");
      return enqueue(client, "echo", { text: "receipt 2" }, { tenant: TENANT });
    },
    { commit: false },
  );
  assert.equal(await job(id), undefined);
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM orders WHERE id = 2");
  assert.equal(rows[0].n, 0);
});

test("refusals are errors with their SQLSTATE and argument; a savepoint keeps the transaction", async () => {
  const id = await inTransaction(async (client) => {
    await client.query("INSERT INTO orders (id, total) VALUES (3, 30)");
    const first = await enqueue(client, "echo", { text: "a" }, { tenant: TENANT, unique_key: "order-3" });
    await assert.rejects(
      enqueue(client, "echo", { text: "b" }, { tenant: TENANT, unique_key: "order-3", savepoint: true }),
      (error) => error.code === Refusal.UNIQUE_KEY_TAKEN && error.column === "unique_key",
    );
    await assert.rejects(
      enqueue(client, "no_such_type", {}, { tenant: TENANT, savepoint: true }),
      (error) => error.code === Refusal.UNKNOWN_JOB_TYPE && /no_such_type/.test(error.message),
    );
    await assert.rejects(
      enqueue(client, "echo", { text: "e" }, { tenant: TENANT, admission: "strict", savepoint: true }),
      (error) => error.code === Refusal.INVALID_ARGUMENT && error.column === "admission",
    );
    const again = await enqueue(client, "echo", { text: "c" }, { tenant: TENANT, idempotency_key: "k3" });
    const replay = await enqueue(client, "echo", { text: "c" }, { tenant: TENANT, idempotency_key: "k3" });
    assert.equal(replay, again);
    await assert.rejects(
      enqueue(client, "echo", { text: "d" }, { tenant: TENANT, idempotency_key: "k3", savepoint: true }),
      (error) => error.code === Refusal.IDEMPOTENCY_CONFLICT,
    );
    return first;
  });
  assert.ok(await job(id));
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM orders WHERE id = 3");
  assert.equal(rows[0].n, 1);
});
