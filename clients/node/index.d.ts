// Types of the captcha-tasks npm package (hand-written; the code is CommonJS).

/** A token taken from a pool: the shape of Python's take_token(). */
export interface PooledToken {
  status: "solved";
  captcha_id: string;
  method: string;
  source: "pool";
  elapsed_s: number;
  /** ISO 8601, UTC. */
  solved_at: string;
  /** ISO 8601, UTC: when the token stops working. */
  expires_at: string;
  user_agent?: string;
  provider?: string;
  /** The site the token is for (host#sitekey). */
  site?: string;
  /** Seconds of life the token had left when it was taken (Redis server's clock). */
  remaining_s: number;
  token: string | Record<string, unknown> | unknown[];
}

/** A captcha solved through the gateway. */
export interface SolvedCaptcha {
  status: "solved";
  captcha_id: string;
  method: string;
  source: "api";
  elapsed_s: number;
  solved_at: string;
  token: string;
}

/** Cookie name -> value, with the store version they were read at (not enumerable). */
export type Cookies = Record<string, string> & { readonly version: number };

export interface CaptchaTasksOptions {
  /** Default: REDIS_URL, else redis://localhost:6379/0 (sentinel://...;sentinel://... too,
   * with REDIS_SENTINEL_MASTER and REDIS_SENTINEL_* as in Python). */
  redisUrl?: string;
  /** Default: CAPTCHAAI_KEY_PREFIX, else "captcha". */
  keyPrefix?: string;
  /** Seconds saved cookies live (default 3600). */
  cookieTtl?: number;
  /** Seconds a proxy lease lives (default 600). */
  proxyTtl?: number;
  /** Where defaults are read (default process.env). */
  env?: Record<string, string | undefined>;
  /** The folder of the Lua scripts (default: the package's copy, else the repository's). */
  luaRoot?: string;
}

export interface SolveTask {
  method: string;
  sitekey?: string;
  pageurl?: string;
  lane?: string;
  tenant?: string;
  /** Further in.php parameters, as the 2captcha protocol names them. */
  params?: Record<string, string | number>;
}

export interface GatewayOptions {
  /** The gateway's base URL (it serves /in.php and /res.php). */
  gateway: string;
  /** The API key the gateway expects. */
  key: string;
  /** Give up after this many seconds (default 180): SolveTimeout. */
  timeoutS?: number;
  /** Seconds between polls (default 5). */
  pollS?: number;
  /** Seconds before the first poll (default 5). */
  firstPollS?: number;
}

export class CookieStore {
  load(domain: string): Promise<Cookies>;
  save(domain: string, cookies: Record<string, string>, options?: { ttl?: number }): Promise<number>;
  version(domain: string): Promise<number>;
  clear(domain: string): Promise<void>;
}

export class SessionLock {
  readonly domain: string;
  readonly ttlMs: number;
  readonly held: boolean;
  acquire(): Promise<boolean>;
  extend(ttlMs?: number): Promise<boolean>;
  release(): Promise<boolean>;
  /** Run fn holding the lock (kept alive every third of its TTL); SessionBusy if held. */
  with<T>(fn: (lock: SessionLock) => Promise<T>): Promise<T>;
}

export class ProxyLeases {
  lease(owner: string): Promise<string | null>;
  release(owner: string): Promise<boolean>;
  current(owner: string): Promise<string | null>;
}

export class Keys {
  constructor(prefix?: string);
  readonly prefix: string;
  poolRegistry(): string;
  poolTokens(name: string): string;
  poolStats(name: string): string;
  poolTakes(name: string): string;
  cookies(domain: string): string;
  sessionLock(domain: string): string;
  sessionVersion(domain: string): string;
  proxies(): string;
  proxyAssignment(owner: string): string;
  proxyOwner(proxyId: string): string;
  proxyQuarantine(): string;
}

export class Library {
  constructor(root?: string);
  readonly root: string;
  names(): string[];
  source(name: string): string;
  sha(name: string): string;
}

export class CaptchaTasks {
  constructor(options?: CaptchaTasksOptions);
  readonly redisUrl: string;
  readonly keys: Keys;
  /** The ioredis client (for reads of your own; change shared state through the methods). */
  readonly redis: import("ioredis").Redis;
  readonly cookies: CookieStore;
  readonly proxies: ProxyLeases;
  takeToken(pool: string, options?: { minRemaining?: number }): Promise<PooledToken | null>;
  sessionLock(domain: string, options?: { ttlMs?: number }): SessionLock;
  solve(task: SolveTask, options: GatewayOptions): Promise<SolvedCaptcha>;
  close(): Promise<void>;
}

/** An entry of Playwright's BrowserContext.addCookies() / cookies(). */
export interface PlaywrightCookie {
  name: string;
  value: string;
  domain?: string;
  path?: string;
  [field: string]: unknown;
}

export function toPlaywright(cookies: Record<string, string>, domain: string, path?: string): PlaywrightCookie[];
export function fromPlaywright(cookies: PlaywrightCookie[], domain: string): Cookies;
export function domainMatches(cookieDomain: string, domain: string): boolean;
export function proxyId(proxy: string): string;

export interface RecaptchaProviderOptions extends GatewayOptions {
  /** A pool name, or a function of the captcha the plugin found naming one (or null). */
  pool?: string | ((captcha: { _vendor: string; id: string; sitekey: string; url: string }) => string | null);
  lane?: string;
  tenant?: string;
}

/** One captcha's answer, in the plugin's CaptchaSolution shape. */
export interface RecaptchaSolution {
  _vendor: string;
  id: string;
  provider: string;
  requestAt: Date;
  responseAt: Date;
  hasSolution: boolean;
  text?: string;
  providerCaptchaId?: string | null;
  /** Why there is no solution (no secret in it). */
  error?: string;
}

/** For puppeteer-extra-plugin-recaptcha: RecaptchaPlugin({ provider: recaptchaProvider(ct, ...) }). */
export function recaptchaProvider(
  ct: CaptchaTasks,
  options: RecaptchaProviderOptions,
): { id: string; fn: (captchas: unknown[]) => Promise<{ solutions: RecaptchaSolution[]; error: string | null }> };

export const version: string;

// -- errors: the tree of captcha_tasks/errors.py ------------------------------------------
export class CaptchaTasksError extends Error {
  constructor(message?: string, code?: string | null, captchaId?: string | null, options?: { cause?: unknown });
  static readonly defaultCode: string;
  readonly code: string;
  readonly captchaId: string | null;
}
export class ConfigurationError extends CaptchaTasksError {}
export class ValidationError extends CaptchaTasksError {}
export class PoolNotFound extends ValidationError {}
export class BadTicket extends ValidationError {}
export class BadMac extends BadTicket {}
export class BadMessage extends ValidationError {}
export class RetryableError extends CaptchaTasksError {}
export class NoSlotError extends RetryableError {}
export class ProviderDown extends RetryableError {}
export class TransportError extends RetryableError {}
export class RateLimited extends RetryableError {}
export class ServerError extends RetryableError {}
export class StoreUnavailable extends RetryableError {}
export class NoProxyAvailable extends RetryableError {}
export class SessionError extends RetryableError {}
export class SessionBusy extends SessionError {}
export class ReauthTimeout extends SessionError {}
export class KafkaDeliveryError extends RetryableError {}
export class KafkaUnavailable extends RetryableError {}
export class ResubmitError extends CaptchaTasksError {}
export class UnsolvableError extends ResubmitError {}
export class TokenExpired extends ResubmitError {}
export class FatalError extends CaptchaTasksError {}
export class AuthError extends FatalError {}
export class ZeroBalance extends FatalError {}
export class BadRequestError extends FatalError {}
export class ProxyError extends FatalError {}
export class UnknownAPIError extends FatalError {}
export class InternalError extends FatalError {}
export class GaveUpError extends CaptchaTasksError {}
export class SolveTimeout extends GaveUpError {}
export class RetriesExhausted extends GaveUpError {}
export class Revoked extends GaveUpError {}
export class BudgetExceeded extends GaveUpError {}
export function fromApiCode(code: string, captchaId?: string | null): CaptchaTasksError;
export function errorTree(): [name: string, parent: string, defaultCode: string][];
