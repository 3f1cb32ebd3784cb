"use strict";
// The error tree of captcha_tasks/errors.py, split by what the caller does next (a test
// compares the two trees):
//
//   CaptchaTasksError          root of everything thrown here
//   ├── ConfigurationError     bad setting or argument; fix the call or the environment
//   ├── ValidationError        bad request (PoolNotFound: the pool is not declared)
//   ├── RetryableError         back off, try again (StoreUnavailable: Redis is down;
//   │                          SessionBusy: another worker holds the session lock; ...)
//   ├── ResubmitError          the captcha failed; submit a new one
//   ├── FatalError             fail fast (AuthError, BadRequestError, ...)
//   └── GaveUpError            a budget ran out (SolveTimeout, ...)
//
// Every error has `code` (the API's error code or ours) and `captchaId` when one is known.
// Messages never hold a key, a token or a cookie value.

class CaptchaTasksError extends Error {
  constructor(message = "", code = null, captchaId = null, options = undefined) {
    const fullCode = code || new.target.defaultCode;
    const suffix = captchaId ? ` (captcha ${captchaId})` : "";
    super(message && message !== fullCode ? `${fullCode}: ${message}${suffix}` : `${fullCode}${suffix}`, options);
    this.name = new.target.name;
    this.code = fullCode;
    this.captchaId = captchaId;
  }
}
CaptchaTasksError.defaultCode = "ERROR_CAPTCHA_TASKS";

/** [name, parent, defaultCode], parents first: the same tree as Python's. */
const TREE = [
  ["ConfigurationError", "CaptchaTasksError", "ERROR_CONFIGURATION"],
  ["ValidationError", "CaptchaTasksError", "ERROR_VALIDATION"],
  ["PoolNotFound", "ValidationError", "ERROR_POOL_NOT_FOUND"],
  ["BadTicket", "ValidationError", "ERROR_BAD_PINGBACK"],
  ["BadMac", "BadTicket", "ERROR_BAD_PINGBACK"],
  ["BadMessage", "ValidationError", "ERROR_BAD_MESSAGE"],
  ["RetryableError", "CaptchaTasksError", "ERROR_RETRYABLE"],
  ["NoSlotError", "RetryableError", "ERROR_NO_SLOT_AVAILABLE"],
  ["ProviderDown", "RetryableError", "ERROR_PROVIDER_DOWN"],
  ["TransportError", "RetryableError", "ERROR_TRANSPORT"],
  ["RateLimited", "RetryableError", "ERROR_RATE_LIMITED"],
  ["ServerError", "RetryableError", "ERROR_SERVER_ERROR"],
  ["StoreUnavailable", "RetryableError", "ERROR_REDIS_UNAVAILABLE"],
  ["NoProxyAvailable", "RetryableError", "ERROR_NO_PROXY_AVAILABLE"],
  ["SessionError", "RetryableError", "ERROR_SESSION"],
  ["SessionBusy", "SessionError", "ERROR_SESSION_LOCKED"],
  ["ReauthTimeout", "SessionError", "ERROR_REAUTH_TIMEOUT"],
  ["KafkaDeliveryError", "RetryableError", "ERROR_KAFKA_DELIVERY"],
  ["KafkaUnavailable", "RetryableError", "ERROR_KAFKA_UNAVAILABLE"],
  ["ResubmitError", "CaptchaTasksError", "ERROR_RESUBMIT"],
  ["UnsolvableError", "ResubmitError", "ERROR_CAPTCHA_UNSOLVABLE"],
  ["TokenExpired", "ResubmitError", "ERROR_TOKEN_EXPIRED"],
  ["FatalError", "CaptchaTasksError", "ERROR_FATAL"],
  ["AuthError", "FatalError", "ERROR_WRONG_USER_KEY"],
  ["ZeroBalance", "FatalError", "ERROR_ZERO_BALANCE"],
  ["BadRequestError", "FatalError", "ERROR_BAD_PARAMETERS"],
  ["ProxyError", "FatalError", "ERROR_BAD_PROXY"],
  ["UnknownAPIError", "FatalError", "ERROR_UNKNOWN"],
  ["InternalError", "FatalError", "ERROR_INTERNAL"],
  ["GaveUpError", "CaptchaTasksError", "ERROR_GAVE_UP"],
  ["SolveTimeout", "GaveUpError", "ERROR_SOLVE_TIMEOUT"],
  ["RetriesExhausted", "GaveUpError", "ERROR_RETRIES_EXHAUSTED"],
  ["Revoked", "GaveUpError", "ERROR_REVOKED"],
  ["BudgetExceeded", "GaveUpError", "ERROR_BUDGET_EXCEEDED"],
];

const classes = { CaptchaTasksError };
for (const [name, parent, code] of TREE) {
  // A named class expression per entry, so stack traces and `err.name` show the type.
  const cls = { [name]: class extends classes[parent] {} }[name];
  cls.defaultCode = code;
  classes[name] = cls;
}

/** The API's error codes (in.php / res.php) and the class each one becomes. */
const BY_CODE = {
  ERROR_NO_SLOT_AVAILABLE: "NoSlotError",
  ERROR_ZERO_BALANCE: "ZeroBalance",
  ERROR_SERVER_ERROR: "ServerError",
  MAX_USER_TURN: "ServerError",
  ERROR_CAPTCHA_UNSOLVABLE: "UnsolvableError",
  ERROR_WRONG_USER_KEY: "AuthError",
  ERROR_KEY_DOES_NOT_EXIST: "AuthError",
  ERROR_TOO_MUCH_REQUESTS: "RateLimited",
  ERROR_BAD_DUPLICATES: "UnsolvableError",
  ERROR_CAPTCHAIMAGE_BLOCKED: "BadRequestError",
  ERROR_BAD_TOKEN_OR_PAGEURL: "BadRequestError",
  ERROR_WRONG_ID_FORMAT: "BadRequestError",
  ERROR_DOMAIN_NOT_ALLOWED: "BadRequestError",
  IP_BANNED: "AuthError",
  ERROR_IP_NOT_ALLOWED: "AuthError",
  ERROR_GOOGLEKEY: "BadRequestError",
  ERROR_PAGEURL: "BadRequestError",
  ERROR_BAD_PARAMETERS: "BadRequestError",
  ERROR_WRONG_CAPTCHA_ID: "BadRequestError",
  ERROR_ZERO_CAPTCHA_FILESIZE: "BadRequestError",
  ERROR_TOO_BIG_CAPTCHA_FILESIZE: "BadRequestError",
  ERROR_WRONG_FILE_EXTENSION: "BadRequestError",
  ERROR_IMAGE_TYPE_NOT_SUPPORTED: "BadRequestError",
  ERROR_PROXY_CONNECTION_FAILED: "ProxyError",
  ERROR_BAD_PROXY: "ProxyError",
};
for (const [, , code] of TREE) {
  if (!(code in BY_CODE)) BY_CODE[code] = TREE.find((entry) => entry[2] === code)[0];
}

/** The error for an API or captcha-tasks error code; an unknown ERROR_* code is fatal. */
function fromApiCode(code, captchaId = null) {
  const cls = classes[BY_CODE[code] || "UnknownAPIError"];
  return new cls("", code, captchaId);
}

/** The tree as [name, parent, defaultCode] rows (tests compare it with Python's). */
function errorTree() {
  return TREE.map((row) => [...row]);
}

/** A thrown argument error: ValidationError (fix the call) whose message names the argument (never
 * its value, which may be a secret). */
function badArgument(name, expected) {
  return new classes.ValidationError(`argument ${name} must be ${expected}`);
}

module.exports = { ...classes, fromApiCode, errorTree, badArgument };
