// Errors of the NATS packages, recognised by their shape (name, code,
// message), never with instanceof: the connection a caller hands to
// Client.open may come from another copy or version of the NATS
// packages than the client's own (the NATS packages pin each other's
// exact versions, so an application easily has two), and an error of
// that copy is an instance of none of this copy's classes.

/** A publish the server refused for permissions: its subject and the server's text. */
export interface PublishRefusal {
  subject: string;
  message: string;
}

/**
 * publishRefusal reads err as the server's permissions violation of a
 * publish ("Permissions Violation for Publish to \"subject\""), from any
 * copy of the NATS packages: null for anything else (a subscription's
 * violation, another error).
 */
export function publishRefusal(err: unknown): PublishRefusal | null {
  if (typeof err !== "object" || err === null) return null;
  const e = err as { message?: unknown; operation?: unknown; subject?: unknown };
  const message = typeof e.message === "string" ? e.message : "";
  if (!/permissions violation/i.test(message)) return null;
  const m = message.match(/(Publish|Subscription) to "(\S+)"/i);
  const operation = typeof e.operation === "string" && e.operation !== "" ? e.operation.toLowerCase() : (m?.[1].toLowerCase() ?? "");
  const subject = typeof e.subject === "string" && e.subject !== "" ? e.subject : (m?.[2] ?? "");
  if (operation !== "publish" || subject === "") return null;
  return { subject, message };
}

/**
 * jetStreamErrCode is the err_code of a JetStream API error (10059:
 * stream not found), from any copy of the NATS packages: its apiError()
 * when it has one, else a numeric code on an error named like one; 0 for
 * anything else.
 */
export function jetStreamErrCode(err: unknown): number {
  if (typeof err !== "object" || err === null) return 0;
  const e = err as { apiError?: unknown; code?: unknown; name?: unknown };
  if (typeof e.apiError === "function") {
    try {
      const a = (e.apiError as () => { err_code?: unknown })();
      if (a && typeof a.err_code === "number") return a.err_code;
    } catch {
      // below
    }
  }
  if (typeof e.code === "number" && typeof e.name === "string" && /(ApiError|NotFoundError)$/.test(e.name)) return e.code;
  return 0;
}
