// Calls to this server's API. The API key lives only in the page's input field (never stored).
const keyInput = () => document.getElementById("api-key");

/** An HTTP error with the server's message already put into one readable sentence per problem. */
export class ApiError extends Error {
  /** status: the HTTP status, or 0 when the server could not be reached. */
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

/** FastAPI's {"detail": "..."} or {"detail": [{"loc": [...], "msg": ...}]} as readable text. */
export function describeError(status, body) {
  const detail = body && body.detail;
  if (Array.isArray(detail)) {
    return detail
      .map((problem) => {
        const field = (problem.loc || []).filter((part) => part !== "body").join(".");
        return field ? `${field}: ${problem.msg}` : problem.msg;
      })
      .join("\n");
  }
  if (typeof detail === "string") return detail;
  return `The server answered ${status} without a message.`;
}

/** " Try again in N s." (or "after <time>") from a Retry-After header (429, 503), or "" without one. */
export function retryAdvice(retryAfter) {
  if (!retryAfter) return "";
  const seconds = Number(retryAfter.trim());
  if (Number.isInteger(seconds) && seconds >= 0) return ` Try again in ${seconds} s.`;
  const date = new Date(retryAfter);
  return Number.isNaN(date.getTime()) ? "" : ` Try again after ${date.toLocaleTimeString()}.`;
}

/** How long the page waits for an answer: past the server's own deadline (10 s by default), then gives up. */
export const TIMEOUT_SECONDS = 30;

/**
 * GET (body undefined) or POST JSON to `path`; resolves to the decoded JSON or rejects with ApiError
 * (status 0: not reached, or no answer within TIMEOUT_SECONDS).
 */
export async function request(path, body) {
  const headers = { accept: "application/json" };
  const key = keyInput().value.trim();
  if (key) headers.authorization = `Bearer ${key}`;
  const init = { method: body === undefined ? "GET" : "POST", headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const deadline = new AbortController();
  const timer = setTimeout(() => deadline.abort(), TIMEOUT_SECONDS * 1000);
  let response;
  let text;
  try {
    response = await fetch(path, { ...init, signal: deadline.signal });
    text = await response.text();
  } catch (error) {
    if (deadline.signal.aborted) throw new ApiError(`The server did not answer within ${TIMEOUT_SECONDS} s.`, 0);
    throw new ApiError(`Could not reach the server (${error.message}).`, 0);
  } finally {
    clearTimeout(timer);
  }
  let decoded = null;
  try {
    decoded = text ? JSON.parse(text) : null;
  } catch {
    decoded = null;
  }
  if (!response.ok) {
    const message = `${response.status}: ${describeError(response.status, decoded)}`;
    throw new ApiError(message + retryAdvice(response.headers.get("retry-after")), response.status);
  }
  return decoded;
}
