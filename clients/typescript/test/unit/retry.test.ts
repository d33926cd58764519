// The retry policy and the problem mapping, against a scripted `fetch`: what the API does
// at a 429 or 503 is in test/api/; here each answer is chosen to pin one rule.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  AuthenticationError,
  ConflictError,
  InvalidRequestError,
  JobcoreClient,
  RateLimitedError,
  type RetryEvent,
  type RetryPolicy,
  UnavailableError,
  retryAfterSeconds,
} from "../../src/index.js";

const JOB_ID = "0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a";

function problem(status: number, slug: string, headers: Record<string, string> = {}): Response {
  const body = { type: `https://jobcore.dev/problems/${slug}`, title: slug, status, detail: slug };
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });
}

function accepted(): Response {
  const body = { job_id: JOB_ID, status: "pending", links: { self: `/jobs/${JOB_ID}` } };
  return new Response(JSON.stringify(body), { status: 202, headers: { "content-type": "application/json" } });
}

/** A client whose `fetch` answers from `script` in turn and records every request. */
function scripted(script: Array<Response | Error>, retry: Partial<RetryPolicy> = {}) {
  const requests: Request[] = [];
  const retries: RetryEvent[] = [];
  const client = new JobcoreClient({
    baseUrl: "http://api.invalid",
    apiKey: "jc_test",
    fetch: async (request) => {
      requests.push(request);
      const next = script.shift();
      if (next === undefined) throw new Error("the script ran out of answers");
      if (next instanceof Error) throw next;
      return next;
    },
    retry: { ...retry, onRetry: (event) => retries.push(event) },
  });
  return { client, requests, retries };
}

test("a 503 is retried after its Retry-After with the same Idempotency-Key and body", async () => {
  const unavailable = problem(503, "database-unavailable", { "retry-after": "0" });
  const { client, requests, retries } = scripted([unavailable, accepted()]);
  const job = await client.enqueue("noop", {});
  assert.equal(job.job_id, JOB_ID);
  assert.equal(requests.length, 2);
  const keys = requests.map((r) => r.headers.get("idempotency-key"));
  assert.equal(keys[0], job.idempotencyKey);
  assert.equal(keys[1], job.idempotencyKey);
  assert.deepEqual(await Promise.all(requests.map((r) => r.text())), ["{}", "{}"]);
  assert.deepEqual(retries.map((e) => [e.attempt, e.status, e.delaySeconds]), [[1, 503, 0]]);
});

test("each logical enqueue has its own Idempotency-Key unless one is given", async () => {
  const { client, requests } = scripted([accepted(), accepted(), accepted()]);
  const first = await client.enqueue("noop", {});
  const second = await client.enqueue("noop", {});
  await client.enqueue("noop", {}, { idempotencyKey: "order-17-receipt" });
  assert.notEqual(first.idempotencyKey, second.idempotencyKey);
  assert.equal(requests[2]!.headers.get("idempotency-key"), "order-17-receipt");
});

test("a Retry-After is waited out before the next attempt", async () => {
  const limited = problem(429, "enqueue-rate-limited", { "retry-after": "1" });
  const { client, retries } = scripted([limited, accepted()]);
  const started = performance.now();
  await client.enqueue("noop", {});
  // A lower bound only: the client must not come back sooner than it was told.
  assert.ok(performance.now() - started >= 990, "retried before Retry-After had passed");
  assert.deepEqual(retries.map((e) => e.delaySeconds), [1]);
});

test("attempts are bounded: the last 429 is thrown as a RateLimitedError", async () => {
  const limited = () => problem(429, "enqueue-rate-limited", { "retry-after": "0" });
  const { client, requests } = scripted([limited(), limited(), limited()], { maxAttempts: 3 });
  const error = await client.enqueue("noop", {}).catch((e: unknown) => e);
  assert.ok(error instanceof RateLimitedError, String(error));
  assert.equal(error.status, 429);
  assert.equal(error.slug, "enqueue-rate-limited");
  assert.equal(error.retryAfter, 0);
  assert.equal(requests.length, 3);
});

test("a Retry-After beyond maxDelaySeconds is not waited out", async () => {
  const { client, requests } = scripted([problem(503, "store-unavailable", { "retry-after": "3600" })]);
  const error = await client.get(JOB_ID).catch((e: unknown) => e);
  assert.ok(error instanceof UnavailableError, String(error));
  assert.equal(error.retryAfter, 3600);
  assert.equal(requests.length, 1);
});

test("a failed connection is retried for a GET and an enqueue, not for a cancel", async () => {
  const view = { id: JOB_ID, status: "pending" };
  const ok = new Response(JSON.stringify(view), { headers: { "content-type": "application/json" } });
  const got = scripted([new TypeError("fetch failed"), ok]);
  assert.equal((await got.client.get(JOB_ID)).status, "pending");
  assert.equal(got.requests.length, 2);

  const enqueued = scripted([new TypeError("fetch failed"), accepted()]);
  const job = await enqueued.client.enqueue("noop", {});
  assert.deepEqual(
    enqueued.requests.map((r) => r.headers.get("idempotency-key")),
    [job.idempotencyKey, job.idempotencyKey],
  );

  const cancelled = scripted([new TypeError("fetch failed")]);
  await assert.rejects(cancelled.client.cancel(JOB_ID), TypeError);
  assert.equal(cancelled.requests.length, 1);
});

test("other refusals are not retried and map to their error class", async () => {
  const cases: Array<[Response, new (...args: never[]) => Error]> = [
    [problem(401, "invalid-api-key"), AuthenticationError],
    [problem(409, "job-not-cancellable"), ConflictError],
    [problem(422, "invalid-payload"), InvalidRequestError],
  ];
  for (const [answer, kind] of cases) {
    const { client, requests } = scripted([answer]);
    await assert.rejects(client.cancel(JOB_ID), kind);
    assert.equal(requests.length, 1);
  }
});

test("Retry-After is read as seconds or as an HTTP date", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(retryAfterSeconds("7", now), 7);
  assert.equal(retryAfterSeconds("Thu, 01 Jan 2026 00:00:05 GMT", now), 5);
  assert.equal(retryAfterSeconds("Wed, 31 Dec 2025 00:00:00 GMT", now), 0);
  assert.equal(retryAfterSeconds("soon", now), undefined);
  assert.equal(retryAfterSeconds(null, now), undefined);
});
