// The client against a running API, relay and worker (tests/e2e/test_typescript_client.py
// starts them with the result store in an S3 bucket and runs `npm test`):
//   JOBCORE_TEST_API_URL          the API's root
//   JOBCORE_TEST_API_KEY          a key of a tenant without quotas
//   JOBCORE_TEST_LIMITED_API_KEY  a key of a tenant allowed one enqueue a second (burst 1)
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  AuthenticationError,
  ConflictError,
  InvalidRequestError,
  JobcoreClient,
  PreconditionError,
  RateLimitedError,
  type RetryEvent,
  WaitTimeoutError,
} from "../../src/index.js";

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run these tests through tests/e2e/test_typescript_client.py`);
  }
  return value;
}

const baseUrl = required("JOBCORE_TEST_API_URL");
const apiKey = required("JOBCORE_TEST_API_KEY");
const limitedKey = required("JOBCORE_TEST_LIMITED_API_KEY");
// Long enough for a job to stay pending through a test: it is cancelled or left to wait.
const LATER = 600;

/** A client that records every request it sends (after the retry layer, one per attempt). */
function recordingClient(key = apiKey, retry: ConstructorParameters<typeof JobcoreClient>[0]["retry"] = {}) {
  const requests: Request[] = [];
  const client = new JobcoreClient({
    baseUrl,
    apiKey: key,
    fetch: (request) => {
      requests.push(request);
      return fetch(request);
    },
    retry,
  });
  return { client, requests };
}

const api = new JobcoreClient({ baseUrl, apiKey });

test("enqueue answers the job, and the same Idempotency-Key answers the same job", async () => {
  const key = `ts-${crypto.randomUUID()}`;
  const first = await api.enqueue("noop", {}, { idempotencyKey: key, delay: LATER });
  const again = await api.enqueue("noop", {}, { idempotencyKey: key, delay: LATER });
  assert.equal(first.status, "pending");
  assert.equal(first.replayed, false);
  assert.equal(again.job_id, first.job_id);
  assert.equal(again.replayed, true);
  const job = await api.get(first.job_id);
  assert.equal(job.type, "noop");
  assert.equal(job.idempotency_key, key);
});

test("createWorkflow: the same Idempotency-Key answers the same workflow; another request is a 422", async () => {
  const key = `ts-wf-${crypto.randomUUID()}`;
  const body = { name: "ts", jobs: [{ name: "a", type: "noop" }, { name: "b", type: "noop", depends_on: ["a"] }] };
  const first = await api.createWorkflow(body, { idempotencyKey: key });
  const again = await api.createWorkflow(body, { idempotencyKey: key });
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(again.id, first.id);
  assert.deepEqual(again.jobs, first.jobs);
  const error = await api
    .createWorkflow({ ...body, name: "another" }, { idempotencyKey: key })
    .catch((e: unknown) => e);
  assert.ok(error instanceof InvalidRequestError);
  assert.equal(error.status, 422);
  assert.equal(error.slug, "idempotency-key-reused");
});

test("wait long-polls until the job has succeeded", async () => {
  const { job_id } = await api.enqueue("noop", {});
  const job = await api.wait(job_id, { timeoutSeconds: 60 });
  assert.equal(job.id, job_id);
  assert.equal(job.status, "succeeded");
  assert.notEqual(job.finished_at, null);
});

test("wait gives up at its timeout with the job's last view", async () => {
  const { job_id } = await api.enqueue("noop", {}, { delay: LATER });
  const error = await api.wait(job_id, { timeoutSeconds: 1 }).catch((e: unknown) => e);
  assert.ok(error instanceof WaitTimeoutError, String(error));
  assert.equal(error.job.status, "pending");
});

test("result: an inline result is its JSON", async () => {
  const { job_id } = await api.enqueue("send_email", { to: "ada@example.org", subject: "Your receipt" });
  assert.equal((await api.wait(job_id, { timeoutSeconds: 60 })).status, "succeeded");
  const result = await api.result(job_id);
  assert.equal(result.stored, false);
  assert.ok(!result.stored);
  const value = result.value as { delivered: boolean; message_id: string };
  assert.equal(value.delivered, true);
  assert.equal(value.message_id, `<${job_id}@jobcore>`);
});

test("result: a result in S3 comes through the 302, without the API key", async () => {
  const { client, requests } = recordingClient();
  const { job_id } = await client.enqueue("export_csv", { rows: 3, columns: ["id", "amount"], seed: 7 });
  assert.equal((await client.wait(job_id, { timeoutSeconds: 60 })).status, "succeeded");
  const result = await client.result(job_id);
  assert.ok(result.stored);
  const lines = (await result.response.text()).trim().split("\n");
  assert.equal(lines[0], "id,amount");
  assert.equal(lines.length, 4);
  const api = new URL(baseUrl).origin;
  const store = requests.filter((r) => new URL(r.url).origin !== api);
  assert.equal(store.length, 1, "one request to the object store");
  assert.ok(new URL(store[0]!.url).searchParams.has("X-Amz-Signature"), store[0]!.url);
  assert.equal(store[0]!.headers.get("authorization"), null);
  for (const request of requests.filter((r) => new URL(r.url).origin === api)) {
    assert.equal(request.headers.get("authorization"), `Bearer ${apiKey}`);
  }
});

test("cancel: a pending job is cancelled; cancelling it again is a 409", async () => {
  const { job_id } = await api.enqueue("noop", {}, { delay: LATER });
  const answer = await api.cancel(job_id);
  assert.equal(answer.status, "cancelled");
  assert.equal((await api.get(job_id)).status, "cancelled");
  const error = await api.cancel(job_id).catch((e: unknown) => e);
  assert.ok(error instanceof ConflictError, String(error));
  assert.equal(error.status, 409);
  assert.equal(error.slug, "job-not-cancellable");
  assert.equal(error.problem.job_status, "cancelled");
});

test("edit: a pending job changes in place at the version read; a stale version is a 412", async () => {
  const { job_id } = await api.enqueue("noop", {}, { delay: LATER });
  const read = await api.get(job_id);
  assert.ok(read.version, "GET answers the job's version");
  const edited = await api.edit(job_id, read.version!, { priority: "high" });
  assert.equal(edited.priority, "high");
  assert.notEqual(edited.version, read.version);
  const error = await api.edit(job_id, read.version!, { priority: "low" }).catch((e: unknown) => e);
  assert.ok(error instanceof PreconditionError, String(error));
  assert.equal(error.status, 412);
  assert.equal(error.slug, "job-version-mismatch");
  await api.cancel(job_id);
});

test("409: a live job holding the unique key, and a result not ready", async () => {
  const unique_key = `ts-${crypto.randomUUID()}`;
  const held = await api.enqueue("noop", {}, { unique_key, delay: LATER });
  const error = await api.enqueue("noop", {}, { unique_key, delay: LATER }).catch((e: unknown) => e);
  assert.ok(error instanceof ConflictError, String(error));
  assert.equal(error.slug, "unique-job-exists");
  assert.equal(error.problem.job_id, held.job_id);

  const notReady = await api.result(held.job_id).catch((e: unknown) => e);
  assert.ok(notReady instanceof ConflictError, String(notReady));
  assert.equal(notReady.slug, "result-not-ready");
  await api.cancel(held.job_id);
});

test("422: an invalid payload names its field; a reused key with another request is refused", async () => {
  const error = await api.enqueue("export_csv", { rows: 0 }).catch((e: unknown) => e);
  assert.ok(error instanceof InvalidRequestError, String(error));
  assert.equal(error.status, 422);
  assert.equal(error.slug, "invalid-payload");
  assert.deepEqual(error.errors[0]?.loc, ["rows"]);

  const key = `ts-${crypto.randomUUID()}`;
  await api.enqueue("noop", {}, { idempotencyKey: key, delay: LATER });
  const reused = await api
    .enqueue("noop", {}, { idempotencyKey: key, delay: LATER + 1 })
    .catch((e: unknown) => e);
  assert.ok(reused instanceof InvalidRequestError, String(reused));
  assert.equal(reused.status, 422);
  assert.equal(reused.slug, "idempotency-key-reused");
});

test("401: a key the API does not know is an AuthenticationError", async () => {
  const stranger = new JobcoreClient({ baseUrl, apiKey: "jc_not-a-key-of-this-api" });
  const error = await stranger.enqueue("noop", {}).catch((e: unknown) => e);
  assert.ok(error instanceof AuthenticationError, String(error));
  assert.equal(error.status, 401);
  assert.equal(error.slug, "invalid-api-key");
  await assert.rejects(stranger.get(crypto.randomUUID()), AuthenticationError);
});

test("429: an enqueue over the tenant's rate is retried after Retry-After, with its key", async () => {
  const once = recordingClient(limitedKey, { maxAttempts: 1 });
  const retried: RetryEvent[] = [];
  const patient = recordingClient(limitedKey, { maxAttempts: 5, onRetry: (event) => retried.push(event) });
  // One a second with a burst of one: the second of two quick enqueues is over the rate.
  await once.client.enqueue("noop", {}, { delay: LATER });
  const refused = await once.client.enqueue("noop", {}, { delay: LATER }).catch((e: unknown) => e);
  assert.ok(refused instanceof RateLimitedError, String(refused));
  assert.equal(refused.slug, "enqueue-rate-limited");
  assert.ok(refused.retryAfter !== undefined && refused.retryAfter >= 1, `Retry-After ${refused.retryAfter}`);

  const job = await patient.client.enqueue("noop", {}, { delay: LATER });
  assert.equal(job.status, "pending");
  assert.ok(retried.length >= 1, "the first attempt was over the rate");
  assert.ok(retried.every((event) => event.status === 429 && event.delaySeconds >= 1));
  const keys = new Set(patient.requests.map((r) => r.headers.get("idempotency-key")));
  assert.deepEqual([...keys], [job.idempotencyKey]);
  assert.equal(patient.requests.length, retried.length + 1);
});
