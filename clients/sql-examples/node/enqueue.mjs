// Enqueue a jobcore job from Node's pg, in the transaction the client has open:
// the job exists exactly when that transaction commits (docs/how-to/enqueue-in-transaction.md).

// The SQLSTATEs jobcore.enqueue() raises its refusals with.
export const Refusal = Object.freeze({
  INVALID_ARGUMENT: "JC400",
  UNKNOWN_JOB_TYPE: "JC404",
  UNIQUE_KEY_TAKEN: "JC409",
  PAYLOAD_TOO_LARGE: "JC413",
  IDEMPOTENCY_CONFLICT: "JC422",
  QUOTA_EXCEEDED: "JC429",
});

const OPTIONS = [
  "idempotency_key",
  "unique_key",
  "ordering_key",
  "priority",
  "run_at",
  "delay",
  "max_attempts",
  "entity_id",
  "admission",
];

/**
 * Enqueue a job of `type` for `tenant` on `client` (a pg Client, or a PoolClient inside
 * BEGIN ... COMMIT) and return its id. `options`: any of idempotency_key, unique_key,
 * ordering_key, priority ("low" | "normal" | "high"), run_at (a Date), delay (an
 * interval, such as "5 minutes"), max_attempts, entity_id, admission ("approximate", the
 * default: the tenant's quotas read without a lock; "exact": under the lock of the tenant's
 * usage row, held until the transaction ends).
 *
 * A refusal is pg's DatabaseError, with `code` one of Refusal and `column` the argument
 * at fault; it aborts the transaction unless the call ran in a savepoint (`savepoint`:
 * true), which is then rolled back so the transaction stays usable.
 */
export async function enqueue(client, type, payload, { tenant, savepoint = false, ...options }) {
  const names = Object.keys(options).filter((name) => options[name] !== undefined);
  for (const name of names) {
    if (!OPTIONS.includes(name)) throw new TypeError(`unknown enqueue option ${name}`);
  }
  const args = names.map((name, i) => `${name} => $${i + 4}`);
  const sql = `SELECT jobcore.enqueue($1, $2::jsonb, tenant => $3${
    args.length ? ", " + args.join(", ") : ""
  }) AS id`;
  const values = [type, JSON.stringify(payload), tenant, ...names.map((name) => options[name])];
  if (!savepoint) {
    const { rows } = await client.query(sql, values);
    return rows[0].id;
  }
  await client.query("SAVEPOINT jobcore_enqueue");
  try {
    const { rows } = await client.query(sql, values);
    await client.query("RELEASE SAVEPOINT jobcore_enqueue");
    return rows[0].id;
  } catch (error) {
    await client.query("ROLLBACK TO SAVEPOINT jobcore_enqueue");
    throw error;
  }
}
