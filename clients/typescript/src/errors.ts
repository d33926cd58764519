/**
 * Typed errors: every answer the API refuses is RFC 9457 problem JSON, turned here into one
 * class per HTTP status, so callers can `catch (e) { if (e instanceof ConflictError) ... }`
 * and still read the problem's `type` for the finer reason.
 */
import type { components } from "./generated/schema.js";

/** The problem JSON the API answers with on every error (`application/problem+json`). */
export type Problem = components["schemas"]["Problem"];

/** The base class of every error this client throws on purpose. */
export class JobcoreError extends Error {
  override name = "JobcoreError";
}

/** The API refused the request: its problem JSON, status and `Retry-After`. */
export class ProblemError extends JobcoreError {
  override name = "ProblemError";
  /** The HTTP status of the answer. */
  readonly status: number;
  /** The problem's `type`, a URI naming the reason (e.g. `.../problems/unique-job-exists`). */
  readonly type: string;
  /** The problem as the API sent it, with its extension members (`errors`, `job_id`, ...). */
  readonly problem: Problem;
  /** Seconds the API asked the caller to wait (`Retry-After`), when it said. */
  readonly retryAfter: number | undefined;

  constructor(problem: Problem, retryAfter?: number) {
    super(`${problem.status} ${problem.title}: ${problem.detail}`);
    this.status = problem.status;
    this.type = problem.type;
    this.problem = problem;
    this.retryAfter = retryAfter;
  }

  /** The last segment of `type`: `unique-job-exists`, `invalid-payload`, ... */
  get slug(): string {
    return this.type.slice(this.type.lastIndexOf("/") + 1);
  }
}

/** 400 and 422: the request (body, query, headers) is not one the API accepts. */
export class InvalidRequestError extends ProblemError {
  override name = "InvalidRequestError";
  /** Where each invalid field is (`loc`) and why (`msg`); empty when the problem names none. */
  get errors(): NonNullable<Problem["errors"]> {
    return this.problem.errors ?? [];
  }
}

/** 401: no API key, or one the API does not know (revoked, expired, mistyped). */
export class AuthenticationError extends ProblemError {
  override name = "AuthenticationError";
}

/** 403: the key lacks the route's scope (`problem.required_scope`). */
export class PermissionError extends ProblemError {
  override name = "PermissionError";
}

/** 404: no such job (or another tenant's), job type or result. */
export class NotFoundError extends ProblemError {
  override name = "NotFoundError";
}

/**
 * 409: the job's state forbids it (finished, result not ready), or a live job holds the
 * unique key (`problem.job_id`).
 */
export class ConflictError extends ProblemError {
  override name = "ConflictError";
}

/**
 * 412: the job changed since the version an edit names was read (read it again); 428: an
 * edit named no version.
 */
export class PreconditionError extends ProblemError {
  override name = "PreconditionError";
}

/** 429: a tenant quota or the API's long-poll cap; retried by the client until its attempts run out. */
export class RateLimitedError extends ProblemError {
  override name = "RateLimitedError";
}

/** 503: the API cannot reach its database or object store; retried like a 429. */
export class UnavailableError extends ProblemError {
  override name = "UnavailableError";
}

/** `wait()` ran out of time before the job finished; `job` is the last view read. */
export class WaitTimeoutError extends JobcoreError {
  override name = "WaitTimeoutError";
  readonly job: components["schemas"]["JobView"];

  constructor(job: components["schemas"]["JobView"], seconds: number) {
    super(`job ${job.id} still ${job.status} after ${seconds} s`);
    this.job = job;
  }
}

const BY_STATUS: Record<number, new (problem: Problem, retryAfter?: number) => ProblemError> = {
  400: InvalidRequestError,
  401: AuthenticationError,
  403: PermissionError,
  404: NotFoundError,
  409: ConflictError,
  412: PreconditionError,
  422: InvalidRequestError,
  428: PreconditionError,
  429: RateLimitedError,
  503: UnavailableError,
};

/**
 * The error for a refused answer whose body was already read as `body` (openapi-fetch reads
 * it). An answer that is not problem JSON (a proxy's HTML page) still gives a ProblemError,
 * with the status and the first bytes of the text as its detail.
 */
export function problemError(response: Response, body: unknown): ProblemError {
  const problem = isProblem(body)
    ? body
    : {
        type: "about:blank",
        title: response.statusText || "HTTP error",
        status: response.status,
        detail: typeof body === "string" ? body.slice(0, 200) : "",
      };
  const kind = BY_STATUS[response.status] ?? ProblemError;
  return new kind(problem, retryAfterSeconds(response.headers.get("retry-after")));
}

function isProblem(body: unknown): body is Problem {
  return (
    typeof body === "object" &&
    body !== null &&
    typeof (body as Problem).type === "string" &&
    typeof (body as Problem).status === "number"
  );
}

/**
 * `Retry-After` in seconds: delay-seconds or an HTTP date (RFC 9110 section 10.2.3);
 * undefined when absent or unreadable.
 */
export function retryAfterSeconds(header: string | null, now: number = Date.now()): number | undefined {
  if (header === null || header.trim() === "") return undefined;
  const text = header.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const date = Date.parse(text);
  return Number.isNaN(date) ? undefined : Math.max(0, (date - now) / 1000);
}
