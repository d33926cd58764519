/** The jobcore HTTP API client: {@link JobcoreClient}, its errors and the generated types. */
export * from "./client.js";
export * from "./errors.js";
export { DEFAULT_RETRY, type RetryEvent, type RetryPolicy } from "./retry.js";
export type { components, operations, paths } from "./generated/schema.js";
