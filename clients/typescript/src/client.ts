/**
 * The hand-written layer over the generated client: enqueue and create a workflow with an
 * idempotency key,
 * retries that honour `Retry-After`, a long-poll `wait`, `result` through the object store,
 * and typed errors. Anything else the API offers is on {@link JobcoreClient.api}, typed
 * from the same OpenAPI document.
 */
import createClient, { type Client } from "openapi-fetch";
import { JobcoreError, WaitTimeoutError, problemError } from "./errors.js";
import type { components, paths } from "./generated/schema.js";
import { DEFAULT_RETRY, type RetryPolicy, retryingFetch, sleep } from "./retry.js";

type Schemas = components["schemas"];
export type JobView = Schemas["JobView"];
export type JobStatus = Schemas["JobStatus"];
export type Accepted = Schemas["Accepted"];
export type CancelAnswer = Schemas["CancelAnswer"];
export type JobEdit = Schemas["JobEdit"];
export type WorkflowIn = Schemas["WorkflowIn"];
export type WorkflowCreatedOut = Schemas["WorkflowCreatedOut"];

/** Each job type's enqueue route, keyed by the type's name (`POST /jobs/{type}`). */
type EnqueueRoutes = {
  [P in keyof paths as P extends `/jobs/${infer T}`
    ? T extends `${string}/${string}` | `{${string}`
      ? never
      : T
    : never]: paths[P];
};

/** The job types of the OpenAPI document the client was generated from. */
export type JobType = keyof EnqueueRoutes & string;

type EnqueueOperation<T extends JobType> = EnqueueRoutes[T]["post"];

/** The payload a job type takes: its schema in the OpenAPI document. */
export type PayloadOf<T extends JobType> =
  EnqueueOperation<T>["requestBody"]["content"]["application/json"];

/** The query parameters every enqueue route takes (`delay`, `unique_key`, `priority`, ...). */
export type EnqueueQuery = NonNullable<EnqueueOperation<JobType>["parameters"]["query"]>;

export type EnqueueOptions = EnqueueQuery & {
  /**
   * Names this logical enqueue: every retry of it, by this client or by the caller after a
   * crash, answers the same job. A new random key per call when not given.
   */
  idempotencyKey?: string;
  signal?: AbortSignal;
};

/** An enqueue the API accepted. */
export interface Enqueued extends Accepted {
  /** The key sent, to retry this same enqueue later. */
  idempotencyKey: string;
  /** True when the key had been used already and this is that first request's job. */
  replayed: boolean;
}

/** A workflow the API created (`201`), or the one an earlier request with its key made. */
export interface WorkflowCreated extends WorkflowCreatedOut {
  /** The key sent, to retry this same create later. */
  idempotencyKey: string;
  /** True when the key had been used already and this is that first request's workflow. */
  replayed: boolean;
}

/** A job's result: inline JSON, or the stored file with its content type. */
export type JobResult =
  | { stored: false; value: unknown }
  | { stored: true; contentType: string; response: Response };

export interface ClientOptions {
  /** The API's root, e.g. `http://127.0.0.1:8000`. */
  baseUrl: string;
  /** A key from `jobcore keys create`, sent as `Authorization: Bearer <key>`. */
  apiKey: string;
  /** The `fetch` to send requests with (default `globalThis.fetch`). */
  fetch?: (request: Request) => Promise<Response>;
  /** How 429 and 503 answers are retried (defaults: {@link DEFAULT_RETRY}). */
  retry?: Partial<RetryPolicy>;
}

/** The statuses a job does not leave. */
export const TERMINAL_STATUSES: ReadonlySet<JobStatus> = new Set(["succeeded", "failed", "cancelled"]);

/** The longest long-poll asked for at once; the API caps it too (JOBCORE_API_MAX_WAIT). */
const LONG_POLL_SECONDS = 60;
/** The least time between two long-polls, should the API answer one early. */
const MIN_POLL_INTERVAL_MS = 500;

/** A client of the jobcore HTTP API. */
export class JobcoreClient {
  /** The generated client, for every route: typed paths, parameters, bodies and answers. */
  readonly api: Client<paths>;
  /** Sends a request with the retry policy, and without the API key (for the object store). */
  private readonly send: (request: Request) => Promise<Response>;

  constructor(options: ClientOptions) {
    const base = options.fetch ?? ((request: Request) => globalThis.fetch(request));
    this.send = retryingFetch(base, { ...DEFAULT_RETRY, ...options.retry });
    this.api = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      headers: { Authorization: `Bearer ${options.apiKey}` },
      fetch: this.send,
    });
  }

  /**
   * Enqueue a job of `type`: `202` with its id. The same idempotency key goes with every
   * attempt, so a retried call never makes a second job.
   * @throws InvalidRequestError (422) for a payload or options the API refuses.
   * @throws ConflictError (409) when a live job holds the unique key (`problem.job_id`).
   */
  async enqueue<T extends JobType>(
    type: T,
    payload: PayloadOf<T>,
    options: EnqueueOptions = {},
  ): Promise<Enqueued> {
    const { idempotencyKey = globalThis.crypto.randomUUID(), signal, ...query } = options;
    // The route is named at run time; its types are PayloadOf<T> and EnqueueQuery above.
    type AnyPost = (path: string, init: object) => ReturnType<Client<paths>["POST"]>;
    const post = this.api.POST as unknown as AnyPost;
    const { data, error, response } = await post(`/jobs/${type}`, {
      params: { query, header: { "Idempotency-Key": idempotencyKey } },
      body: payload,
      signal,
    });
    if (!response.ok) throw problemError(response, error);
    return {
      ...(data as Accepted),
      idempotencyKey,
      replayed: response.headers.get("idempotent-replayed") === "true",
    };
  }

  /**
   * Create a workflow (`POST /workflows`): its jobs and their edges in one transaction. The
   * same idempotency key (a random UUID unless given) goes with every attempt, so a retried
   * call never makes a second workflow.
   * @throws InvalidRequestError (422) for an invalid graph or payload, or a key reused with
   * another request (`idempotency-key-reused`).
   */
  async createWorkflow(
    workflow: WorkflowIn,
    options: { idempotencyKey?: string; signal?: AbortSignal } = {},
  ): Promise<WorkflowCreated> {
    const { idempotencyKey = globalThis.crypto.randomUUID(), signal } = options;
    const { data, error, response } = await this.api.POST("/workflows", {
      params: { header: { "Idempotency-Key": idempotencyKey } },
      body: workflow,
      signal,
    });
    if (!response.ok || data === undefined) throw problemError(response, error);
    return {
      ...data,
      idempotencyKey,
      replayed: response.headers.get("idempotent-replayed") === "true",
    };
  }

  /** The job now, or with `wait` after up to that many seconds if it has not ended by then. */
  async get(jobId: string, options: { wait?: number; signal?: AbortSignal } = {}): Promise<JobView> {
    const { data, error, response } = await this.api.GET("/jobs/{job_id}", {
      params: { path: { job_id: jobId }, query: options.wait === undefined ? {} : { wait: options.wait } },
      signal: options.signal,
    });
    if (!response.ok || data === undefined) throw problemError(response, error);
    return data;
  }

  /**
   * The job once it has ended (succeeded, failed or cancelled), by long-polls of
   * `GET /jobs/{id}?wait=`: the answer comes as soon as the job ends, not at the next poll.
   * @param timeoutSeconds how long to wait in all (default 300).
   * @throws WaitTimeoutError when the job has not ended by then, with its last view.
   */
  async wait(
    jobId: string,
    options: { timeoutSeconds?: number; signal?: AbortSignal } = {},
  ): Promise<JobView> {
    const timeoutSeconds = options.timeoutSeconds ?? 300;
    const deadline = Date.now() + timeoutSeconds * 1000;
    for (;;) {
      const started = Date.now();
      const remaining = Math.max(0, (deadline - started) / 1000);
      const job = await this.get(jobId, {
        wait: Math.min(LONG_POLL_SECONDS, Math.round(remaining * 10) / 10),
        signal: options.signal,
      });
      if (TERMINAL_STATUSES.has(job.status)) return job;
      if (Date.now() >= deadline) throw new WaitTimeoutError(job, timeoutSeconds);
      // Only an API whose cap on waits is very short answers a running job this soon.
      const early = MIN_POLL_INTERVAL_MS - (Date.now() - started);
      if (early > 0) await sleep(early, options.signal);
    }
  }

  /**
   * A succeeded job's result. A stored result in a bucket comes from the `302`'s presigned
   * URL, fetched with no header of ours: the URL is its own credential, and the API key
   * never leaves for the store's origin. A stored result's `response` is unread, to stream.
   * @throws ConflictError (409) while the job has not succeeded (`problem.job_status`).
   */
  async result(jobId: string, options: { signal?: AbortSignal } = {}): Promise<JobResult> {
    const { error, response } = await this.api.GET("/jobs/{job_id}/result", {
      params: { path: { job_id: jobId } },
      parseAs: "stream",
      redirect: "manual",
      signal: options.signal,
    });
    if (response.status === 302) {
      const location = response.headers.get("location");
      if (location === null) throw new JobcoreError(`job ${jobId}'s result: a 302 without Location`);
      const url = new URL(location, response.url);
      const stored = await this.send(new Request(url, { signal: options.signal }));
      if (!stored.ok) {
        await stored.body?.cancel();
        throw new JobcoreError(`job ${jobId}'s result: the object store answered ${stored.status}`);
      }
      return { stored: true, contentType: contentType(stored), response: stored };
    }
    if (!response.ok) throw problemError(response, error);
    const type = contentType(response);
    if (type === "application/json") return { stored: false, value: await response.json() };
    return { stored: true, contentType: type, response };
  }

  /**
   * Change a pending job's `run_at`, `priority` or `payload` in place, if it is still the
   * version read (`JobView.version`, the ETag of `get`); the job after the edit, with its
   * new `version`.
   * @throws PreconditionError (412) when the job changed since that version was read.
   * @throws ConflictError (409) when it was claimed or has ended.
   */
  async edit(
    jobId: string,
    version: string,
    changes: JobEdit,
    options: { signal?: AbortSignal } = {},
  ): Promise<JobView> {
    const { data, error, response } = await this.api.PATCH("/jobs/{job_id}", {
      params: { path: { job_id: jobId }, header: { "If-Match": `"${version}"` } },
      body: changes,
      signal: options.signal,
    });
    if (!response.ok || data === undefined) throw problemError(response, error);
    return data;
  }

  /**
   * Cancel a job: a pending one at once (`status: "cancelled"`), a running one by asking its
   * worker to stop (`cancel_requested: true`).
   * @throws ConflictError (409) when the job has already ended.
   */
  async cancel(jobId: string, options: { signal?: AbortSignal } = {}): Promise<CancelAnswer> {
    const { data, error, response } = await this.api.POST("/jobs/{job_id}/cancel", {
      params: { path: { job_id: jobId } },
      signal: options.signal,
    });
    if (!response.ok || data === undefined) throw problemError(response, error);
    return data;
  }
}

function contentType(response: Response): string {
  return (response.headers.get("content-type") ?? "application/octet-stream").split(";")[0]!.trim();
}
