/**
 * Retries as a `fetch` wrapper, below the generated client: a request is sent again, byte
 * for byte and with the same `Idempotency-Key`, so a retried enqueue can only ever answer
 * the job its first attempt created.
 */
import { retryAfterSeconds } from "./errors.js";

/** How the client retries; every field has a default (see {@link DEFAULT_RETRY}). */
export interface RetryPolicy {
  /** Attempts per call, the first included. */
  maxAttempts: number;
  /**
   * The longest wait honoured, in seconds. An answer asking for longer (`Retry-After: 3600`)
   * is returned as it is, so the caller sees the 429 or 503 instead of a stalled call.
   */
  maxDelaySeconds: number;
  /** Called before each retry's wait: for logs, metrics and tests. */
  onRetry?: (event: RetryEvent) => void;
}

/** What {@link RetryPolicy.onRetry} is told. */
export interface RetryEvent {
  /** The attempt that failed, from 1. */
  attempt: number;
  /** Its status (429 or 503), or undefined when the connection failed. */
  status: number | undefined;
  /** Seconds until the next attempt: the answer's `Retry-After`, else a backoff. */
  delaySeconds: number;
  request: Request;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 4, maxDelaySeconds: 30 };

/** The statuses the API sends when nothing was done and a later attempt may succeed. */
const RETRIED_STATUSES = new Set([429, 503]);

/**
 * `fetch`, retrying 429 and 503 answers after their `Retry-After` (at most
 * `policy.maxAttempts` attempts). A connection that fails before any answer is retried only
 * when repeating the request is safe: a `GET`, or a request with an `Idempotency-Key`.
 */
export function retryingFetch(
  inner: (request: Request) => Promise<Response>,
  policy: RetryPolicy,
): (request: Request) => Promise<Response> {
  return async (request: Request): Promise<Response> => {
    for (let attempt = 1; ; attempt++) {
      const last = attempt >= policy.maxAttempts;
      let response: Response;
      try {
        // A clone per attempt: a body can be read only once.
        response = await inner(request.clone());
      } catch (error) {
        if (last || request.signal.aborted || !repeatable(request)) throw error;
        await pause(request, { attempt, status: undefined, delaySeconds: backoff(attempt), request }, policy);
        continue;
      }
      if (last || !RETRIED_STATUSES.has(response.status)) return response;
      const delaySeconds = retryAfterSeconds(response.headers.get("retry-after")) ?? backoff(attempt);
      if (delaySeconds > policy.maxDelaySeconds) return response;
      await response.body?.cancel(); // frees the connection for the next attempt
      await pause(request, { attempt, status: response.status, delaySeconds, request }, policy);
    }
  };
}

function repeatable(request: Request): boolean {
  return request.method === "GET" || request.headers.has("idempotency-key");
}

/** Exponential backoff for an answer without `Retry-After`: 0.5 s, 1 s, 2 s, ... */
function backoff(attempt: number): number {
  return 0.5 * 2 ** (attempt - 1);
}

async function pause(request: Request, event: RetryEvent, policy: RetryPolicy): Promise<void> {
  policy.onRetry?.(event);
  await sleep(event.delaySeconds * 1000, request.signal);
}

/** Resolves after `ms`, or rejects as soon as `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
